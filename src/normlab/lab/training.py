"""A tiny character-level language-modelling loop shared by the lab's training experiments.

Contract: the shipped corpus (`lab/data/corpus.txt`, original prose written for normlab) is read
with `importlib.resources`, encoded character by character, split into a training and a
validation part, and served as random windows drawn from a generator that the caller passes in.
[train_lm][normlab.lab.training.train_lm] runs AdamW with an optional linear warmup and stops
early when the loss is no longer finite. Dimension letters: B = batch, T = time (context), V =
vocabulary.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from importlib import resources

import numpy as np

from normlab.lab.result import ExperimentResult, Progress, Settings
from normlab.nn import TransformerLM, softmax_cross_entropy
from normlab.nn.optim import AdamW

__all__ = [
    "ADAM_BETAS",
    "CharCorpus",
    "TrainLog",
    "load_corpus",
    "lr_at",
    "on_one_thread",
    "on_references",
    "sample_batch",
    "single_threaded",
    "train_lm",
]


ADAM_BETAS = (0.9, 0.98)
"""The AdamW betas of [train_lm][normlab.lab.training.train_lm] (Vaswani et al. 2017; Xiong
et al. 2020 train with the same)."""


@contextlib.contextmanager
def single_threaded() -> Iterator[None]:
    """Run the block with one BLAS thread and one numba thread, then restore both.

    The lab's models multiply matrices of a few hundred rows: extra threads only add
    synchronisation, which turns into waiting (tens of milliseconds per product) as soon
    as other processes share the cores, and the thread count would change the summation
    order from one machine to the next. BLAS is limited through `threadpoolctl` when it
    is installed; numba through `numba.set_num_threads` when numba is.

    Examples
    --------
    >>> with single_threaded():
    ...     pass
    """
    with contextlib.ExitStack() as stack:
        try:
            threadpoolctl = importlib.import_module("threadpoolctl")
            stack.enter_context(threadpoolctl.threadpool_limits(limits=1, user_api="blas"))
        except ImportError:  # optional: the experiment only runs slower under load
            pass
        try:
            numba = importlib.import_module("numba")
        except ImportError:
            numba = None
        if numba is not None:
            before = numba.get_num_threads()
            numba.set_num_threads(1)
            stack.callback(numba.set_num_threads, before)
        yield


def on_one_thread(
    run: Callable[[Settings, Progress], ExperimentResult],
) -> Callable[[Settings, Progress], ExperimentResult]:
    """Make an experiment's `run` use one BLAS thread and one numba thread.

    For experiments made of many calls on small arrays: one thread avoids the
    synchronisation waits that dominate small products on shared cores. Which of kernel
    and reference runs, serially or in parallel, is the library's decision
    (`normlab._backend`, `normlab.kernels._adapt`): small inputs already run the
    serial kernels on the calling thread (an (8, 64) LayerNorm forward took 20 us there
    against 87 us through the NumPy reference).
    """

    @functools.wraps(run)
    def wrapped(settings: Settings, progress: Progress) -> ExperimentResult:
        with single_threaded():
            return run(settings, progress)

    return wrapped


# The former name: it used to force the NumPy references, a speed policy that now lives in
# the library (and whose premise, references faster than kernels on small arrays, did not
# hold). Kept so the experiments need no change.
on_references = on_one_thread
"""The former name of [on_one_thread][normlab.lab.training.on_one_thread] (same function)."""


@dataclass(frozen=True)
class CharCorpus:
    """A text encoded as character ids, with its alphabet.

    Attributes
    ----------
    alphabet : str
        The distinct characters, in id order.
    ids : numpy.ndarray
        The text as int32 ids, shape (length,).
    """

    alphabet: str
    ids: np.ndarray

    @property
    def vocab(self) -> int:
        """The number of distinct characters (V)."""
        return len(self.alphabet)

    def split(self, valid_fraction: float = 0.1) -> tuple[np.ndarray, np.ndarray]:
        """The first `1 - valid_fraction` of the ids for training, the rest for validation."""
        cut = int(self.ids.size * (1.0 - valid_fraction))
        return self.ids[:cut], self.ids[cut:]


def load_corpus() -> CharCorpus:
    """The shipped prose corpus as a `CharCorpus` (alphabet sorted by code point).

    >>> c = load_corpus(); c.vocab < 100 and c.ids.size > 20_000
    True
    """
    text = resources.files("normlab.lab").joinpath("data/corpus.txt").read_text(encoding="utf-8")
    alphabet = "".join(sorted(set(text)))
    lookup = {ch: i for i, ch in enumerate(alphabet)}
    ids = np.fromiter((lookup[ch] for ch in text), dtype=np.int32, count=len(text))
    return CharCorpus(alphabet, ids)


def sample_batch(
    ids: np.ndarray, batch: int, context: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """`batch` random windows: inputs ids[s:s+T] and next-character targets ids[s+1:s+T+1]."""
    starts = rng.integers(0, ids.size - context - 1, size=batch)  # B
    offsets = starts[:, None] + np.arange(context)[None, :]  # B,T
    return ids[offsets], ids[offsets + 1]


def lr_at(step: int, peak: float, warmup: int, total: int = 0, final: float = 1.0) -> float:
    """Linear warmup over `warmup` steps, times a linear decay to `final * peak` at `total`.

    lr(t) = peak * min(1, (t + 1) / warmup) * (1 - (1 - final) * t / total)

    `warmup = 0` starts at the peak; `total = 0` (or `final = 1`) means no decay.

    >>> lr_at(0, 1.0, 4), lr_at(3, 1.0, 4), lr_at(9, 1.0, 0), lr_at(50, 1.0, 0, 100, 0.0)
    (0.25, 1.0, 1.0, 0.5)
    """
    warm = 1.0 if warmup <= 0 else min(1.0, (step + 1) / warmup)
    decay = 1.0 if total <= 0 else 1.0 - (1.0 - final) * min(step, total) / total
    return peak * warm * decay


@dataclass
class TrainLog:
    """Loss curve of one run (NaN after a divergence) and its final validation loss.

    Attributes
    ----------
    train_loss : list of float
        The training loss of every step (NaN after a divergence).
    valid_loss : float
        The final validation loss, in nats per character (NaN when diverged).
    diverged : bool
        True when the training loss became NaN or inf.
    """

    train_loss: list[float] = field(default_factory=list)
    valid_loss: float = math.nan
    diverged: bool = False


def _valid_loss(model: TransformerLM, ids: np.ndarray, context: int) -> float:
    n = (ids.size - 1) // context
    x = ids[: n * context].reshape(n, context)  # B,T
    y = ids[1 : n * context + 1].reshape(n, context)  # B,T
    loss, _ = softmax_cross_entropy(model.forward(x), y)
    model.forward(x[:1, :1])  # drop the large cache of the evaluation batch
    return float(loss)


def train_lm(
    model: TransformerLM,
    corpus: CharCorpus,
    *,
    steps: int,
    batch: int,
    context: int,
    peak_lr: float,
    warmup: int,
    rng: np.random.Generator,
    final_lr_fraction: float = 1.0,
    on_step: Callable[[], None] | None = None,
) -> TrainLog:
    """Train `model` with AdamW (betas 0.9/0.98, no weight decay) on random windows.

    The learning rate follows [lr_at][normlab.lab.training.lr_at] (warmup, then linear decay to
    `final_lr_fraction * peak_lr` at the last step).

    Stops as soon as the training loss is NaN or inf (the run is marked `diverged` and the
    rest of its curve is NaN).

    Parameters
    ----------
    model
        The language model (its parameters are updated in place).
    corpus
        The encoded text; the first 90% trains, the last 10% validates.
    steps, batch, context
        Optimizer steps, windows per batch (B), window length (T).
    peak_lr, warmup, final_lr_fraction
        The schedule of [lr_at][normlab.lab.training.lr_at].
    rng
        Draws the windows.
    on_step
        Called after every completed step (progress bars).

    Returns
    -------
    TrainLog
        The training loss of every step and the validation loss (mean next-character
        cross-entropy in nats over non-overlapping windows of the validation text).

    """
    train_ids, valid_ids = corpus.split()
    opt = AdamW(model.parameters(), lr=peak_lr, betas=ADAM_BETAS, weight_decay=0.0)
    log = TrainLog()
    for step in range(steps):
        x, y = sample_batch(train_ids, batch, context, rng)  # B,T each
        opt.lr = lr_at(step, peak_lr, warmup, steps, final_lr_fraction)
        model.zero_grad()
        with np.errstate(over="ignore", invalid="ignore"):
            logits = model.forward(x)  # B,T,V
            if not np.all(np.isfinite(logits)):
                log.diverged = True
            else:
                loss, dlogits = softmax_cross_entropy(logits, y)
                log.diverged = not math.isfinite(loss)
        if log.diverged:
            log.train_loss.extend([math.nan] * (steps - step))
            return log
        log.train_loss.append(float(loss))
        model.backward(dlogits)
        opt.step()
        if on_step is not None:
            on_step()
    log.valid_loss = _valid_loss(model, valid_ids, context)
    return log
