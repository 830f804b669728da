"""A griffe extension for the house docstrings (CONTRIBUTING.md, "Docstrings").

Before parsing, each docstring's text is adjusted so it renders as written:

* `Example` sections read as numpydoc's `Examples`: without this griffe leaves such a
  section in the description, where markdown turns the dashes into a heading and reads code
  such as `rows[0]["key"]` as a link; with it, `>>>` lines become highlighted code.
* Math-like prose such as `blocks[i-1](x_{i-1})` is not a markdown link: outside code
  (backtick spans, `>>>` lines, fenced blocks) `](` is escaped unless a URL
  or a path follows.

Once the package is loaded, what `help()` shows on a class is shown on the site too:

* an entry of a class's `Attributes` section becomes the docstring of that attribute when it
  has none (the entry leaves the section, so the page does not say it twice);
* a method without a docstring that overrides a documented method of a base class (a layer's
  `forward`, `backward`) gets the base's docstring, as `inspect.getdoc` does;
* the constants every lab experiment declares (`NAME`, `TITLE`, `DETECTS`) are documented
  once, in `normlab.lab.result.CONTRACT`: each experiment module's undocumented one gets
  that text.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

_EXAMPLE = re.compile(r"^([ \t]*)Example\n([ \t]*)-{7,}[ \t]*$", re.M)
_NOT_A_LINK = re.compile(r"\]\((?!https?://|\.{0,2}/|#|[\w.-]+\.(?:md|html|png)\b)")
_CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1")


def _escape_pseudo_links(text: str) -> str:
    out, fenced = [], False
    for line in text.split("\n"):
        stripped = line.lstrip()
        if stripped.startswith("```"):
            fenced = not fenced
        if fenced or stripped.startswith((">>>", "...")):
            out.append(line)
            continue
        pieces, last = [], 0
        for span in _CODE_SPAN.finditer(line):
            pieces.append(_NOT_A_LINK.sub(r"]\\(", line[last : span.start()]))
            pieces.append(span.group(0))
            last = span.end()
        pieces.append(_NOT_A_LINK.sub(r"]\\(", line[last:]))
        out.append("".join(pieces))
    return "\n".join(out)


def house_style(text: str) -> str:
    """The docstring `text` as the numpy parser and markdown should see it."""
    return _escape_pseudo_links(_EXAMPLE.sub(r"\1Examples\n\2--------", text))


def attributes_to_members(obj: griffe.Object) -> list[str]:
    """Give each undocumented attribute of `obj` its `Attributes` entry; the names moved."""
    if obj.docstring is None:
        return []
    moved = []
    for section in obj.docstring.parsed:
        if section.kind is not griffe.DocstringSectionKind.attributes:
            continue
        kept = []
        for item in section.value:
            names = [name.strip() for name in item.name.split(",")]  # "gamma, beta : ..."
            members = [obj.members.get(name) for name in names]
            if not item.description.strip() or any(
                m is None or m.is_alias or m.docstring is not None for m in members
            ):
                kept.append(item)
                continue
            for name, member in zip(names, members, strict=True):
                assert member is not None
                member.docstring = griffe.Docstring(
                    item.description,
                    parent=member,
                    parser=obj.docstring.parser,
                    parser_options=obj.docstring.parser_options,
                )
                moved.append(name)
        section.value = kept
    obj.docstring.parsed[:] = [
        s
        for s in obj.docstring.parsed
        if s.kind is not griffe.DocstringSectionKind.attributes or s.value
    ]
    return moved


def parameters_to_fields(cls: griffe.Object) -> list[str]:
    """Give each undocumented attribute that stores a constructor parameter of the same name
    that parameter's text (a dataclass field, `self.eps = eps`); the names given."""
    if cls.docstring is None:
        return []
    given = []
    for section in cls.docstring.parsed:
        if section.kind is not griffe.DocstringSectionKind.parameters:
            continue
        for item in section.value:
            member = cls.members.get(item.name)
            if (
                member is None
                or member.is_alias
                or not member.is_attribute
                or member.docstring is not None
                or not item.description.strip()
            ):
                continue
            member.docstring = griffe.Docstring(
                item.description,
                parent=member,
                parser=cls.docstring.parser,
                parser_options=cls.docstring.parser_options,
            )
            given.append(item.name)
    return given


def inherit_method_docstrings(cls: griffe.Class) -> list[str]:
    """Give each undocumented method of `cls` the docstring of the method it overrides."""
    inherited = []
    try:
        bases = cls.mro()
    except Exception:  # a base outside the loaded packages: nothing to inherit from here
        return inherited
    for name, member in cls.members.items():
        if member.is_alias or not member.is_function or member.docstring is not None:
            continue
        for base in bases:
            found = base.members.get(name)
            if found is not None and not found.is_alias and found.docstring is not None:
                member.docstring = griffe.Docstring(
                    found.docstring.value,
                    parent=member,
                    parser=found.docstring.parser,
                    parser_options=found.docstring.parser_options,
                )
                inherited.append(name)
                break
    return inherited


def contract_docstrings(
    module: griffe.Object, contract: dict[str, str], parent: griffe.Object
) -> list[str]:
    """Give each undocumented member of `module` named in `contract` its text; the names.

    `parent` lends its docstring parser (the package being loaded).
    """
    given = []
    for name, text in contract.items():
        member = module.members.get(name)
        if member is None or member.is_alias or member.docstring is not None:
            continue
        member.docstring = griffe.Docstring(
            text,
            parent=member,
            parser=parent.docstring.parser if parent.docstring else None,
            parser_options=parent.docstring.parser_options if parent.docstring else None,
        )
        given.append(name)
    return given


def _experiment_contracts(pkg: griffe.Module) -> None:
    """`contract_docstrings` on every module of `normlab.lab.experiments`."""
    if pkg.path != "normlab" or "lab" not in pkg.members:
        return
    from normlab.lab.result import CONTRACT  # the documentation builds the tree it documents

    experiments = pkg.members["lab"].members.get("experiments")
    for module in experiments.members.values() if experiments is not None else ():
        if not module.is_alias and module.is_module:
            contract_docstrings(module, CONTRACT, pkg)


def _objects(obj: griffe.Object) -> list[griffe.Object]:
    found = [obj]
    for member in obj.members.values():
        if not member.is_alias and (member.is_module or member.is_class):
            found += _objects(member)
    return found


class HouseStyleDocstrings(griffe.Extension):
    """Apply `house_style` to every docstring, then the `help()`-like completions above."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = house_style(obj.docstring.value)

    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        for obj in _objects(pkg):
            if obj.is_class:
                inherit_method_docstrings(obj)  # type: ignore[arg-type]
            attributes_to_members(obj)
            if obj.is_class:
                parameters_to_fields(obj)
        _experiment_contracts(pkg)

