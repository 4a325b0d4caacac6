"""Embedded sequence tasks: the default dataset, generated, needing no download.

Each example is a random payload `x` of `payload_length` tokens and the
answer `f(x)` of the same length, in causal-LM form:

    tokens  = [BOS] x [SEP] f(x) [EOS]                  (2P + 3 tokens)
    inputs  = tokens[:-1]                               (2P + 2 tokens)
    targets = tokens[1:], with the prompt part (x and SEP) set to pad 0

so the loss and the accuracy count only the P + 1 answer positions (f(x) and
EOS), which are fully determined by the prompt: a model that learns the task
drives the loss towards 0, far below chance.

Tasks: `copy` (f(x) = x), `reverse` (x backwards), `sort` (x ascending).
Payload ids are `4 .. 4 + payload_vocab - 1`; ids 0-3 are pad, BOS, SEP, EOS.

Chance level (`EmbeddedTaskSource.chance()`): a model that ignores the prompt
guesses each answer token uniformly among the payload tokens and gets EOS
right (its position is fixed), so per counted target

    loss     = P / (P + 1) * ln(payload_vocab)
    accuracy = (P / payload_vocab + 1) / (P + 1)

With the defaults (P = 8, payload_vocab = 16): loss 2.465, accuracy 0.167.
For `copy` and `reverse` this is the best any prompt-blind model can do; for
`sort` a prompt-blind model can do a little better (sorted answers are
monotone), so read it as a reference, not a bound.
"""

import dataclasses
import math

import numpy as np

from tfdist.data.source import ArraySource
from tfdist.data.tokens import BOS_ID, EOS_ID, NUM_RESERVED, PAD_ID, SEP_ID

TASKS = ("copy", "reverse", "sort")
SPLITS = ("train", "validation", "test")


@dataclasses.dataclass(frozen=True)
class Chance:
    """Loss (nats per counted target) and accuracy of a model that learned nothing.

    Example:

    >>> print(EmbeddedTaskSource("reverse").chance())
    chance: loss 2.465, accuracy 0.167 (prompt-blind uniform guess over 16 payload tokens)
    """

    loss: float
    accuracy: float
    description: str

    def __str__(self):
        return f"chance: loss {self.loss:.3f}, accuracy {self.accuracy:.3f} ({self.description})"


def answer(task, payload):
    """Returns `f(payload)` for a task, row-wise.

    Args:
        task: one of `TASKS`.
        payload: int array `[num_examples, payload_length]`.

    Raises:
        ValueError: unknown task (the valid ones are listed).

    Example:

    >>> answer("reverse", np.array([[4, 5, 6]])).tolist()
    [[6, 5, 4]]
    """
    payload = np.asarray(payload)
    if task == "copy":
        return payload.copy()
    if task == "reverse":
        return payload[:, ::-1].copy()
    if task == "sort":
        return np.sort(payload, axis=1)
    raise ValueError(f"Unknown embedded task {task!r}; valid tasks: {', '.join(TASKS)}.")


def generate_tokens(task, num_examples, payload_length=8, payload_vocab=16, seed=0, split="train"):
    """Generates `[num_examples, 2 * payload_length + 3]` token rows of a task.

    Deterministic: the same arguments always give the same rows; each split
    draws from its own random stream.

    Args:
        task: one of `TASKS`.
        num_examples: number of rows, >= 1.
        payload_length: tokens in the prompt payload, >= 1.
        payload_vocab: number of distinct payload tokens, >= 2.
        seed: integer seed.
        split: one of `SPLITS`.

    Example:

    >>> generate_tokens("copy", 1, payload_length=2, payload_vocab=4, seed=3).shape
    (1, 7)
    """
    _check_positive("num_examples", num_examples, 1)
    _check_positive("payload_length", payload_length, 1)
    _check_positive("payload_vocab", payload_vocab, 2)
    if split not in SPLITS:
        raise ValueError(f"Unknown split {split!r}; valid splits: {', '.join(SPLITS)}.")
    if task not in TASKS:
        raise ValueError(f"Unknown embedded task {task!r}; valid tasks: {', '.join(TASKS)}.")
    rng = np.random.default_rng([int(seed), SPLITS.index(split), TASKS.index(task)])
    payload = rng.integers(NUM_RESERVED, NUM_RESERVED + payload_vocab,
                           size=(num_examples, payload_length))
    column = np.ones([num_examples, 1], np.int64)
    return np.concatenate([column * BOS_ID, payload, column * SEP_ID,
                           answer(task, payload), column * EOS_ID], axis=1).astype(np.int32)


def _check_positive(name, value, minimum):
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}.")


class EmbeddedTaskSource(ArraySource):
    """A generated copy / reverse / sort task, in memory (sharded by record).

    Args:
        task: `"copy"`, `"reverse"` or `"sort"`.
        num_examples: examples in the split (one epoch).
        payload_length: P, tokens per payload; `sequence_length` is 2P + 2.
        payload_vocab: distinct payload tokens; `vocab_size` is 4 + payload_vocab.
        seed: generation seed.
        split: `"train"`, `"validation"` or `"test"` (independent streams).

    Attributes:
        answer_length: P + 1 counted target positions per example.
        prompt_length: P + 1 leading target positions that are pad.

    Example:

    >>> source = EmbeddedTaskSource("reverse", num_examples=4096)
    >>> source.vocab_size, source.sequence_length
    (20, 18)
    >>> dataset = distribute_dataset(strategy, source, global_batch_size=64)
    """

    def __init__(self, task="reverse", num_examples=8192, payload_length=8, payload_vocab=16,
                 seed=0, split="train"):
        tokens = generate_tokens(task, num_examples, payload_length, payload_vocab, seed, split)
        inputs, targets = tokens[:, :-1], tokens[:, 1:].copy()
        self.prompt_length = payload_length + 1
        targets[:, :self.prompt_length] = PAD_ID
        super().__init__(inputs, targets, vocab_size=NUM_RESERVED + payload_vocab)
        self.task = task
        self.payload_length = payload_length
        self.payload_vocab = payload_vocab
        self.answer_length = payload_length + 1
        self.seed = seed
        self.split = split

    def chance(self):
        """Returns the prompt-blind `Chance` level (see the module docstring)."""
        p, v = self.payload_length, self.payload_vocab
        return Chance(loss=p / (p + 1) * math.log(v), accuracy=(p / v + 1) / (p + 1),
                      description=f"prompt-blind uniform guess over {v} payload tokens")

    def describe(self):
        return (f"EmbeddedTaskSource(task={self.task!r}, split={self.split!r}, "
                f"{self.num_examples} examples, payload {self.payload_length} tokens of "
                f"{self.payload_vocab}, vocab_size={self.vocab_size}, "
                f"sequence_length={self.sequence_length})")
