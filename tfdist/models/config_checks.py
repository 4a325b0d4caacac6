"""The checks every Transformer configuration shares (decoder-only and encoder-decoder).

Each error names the configuration class and field, the value received and
what is allowed.

Example:

    check_transformer_fields(config, int_fields=("vocab_size", "max_len", "d_model"))
"""

import numbers

from tfdist.models.activations import GELU_FORMS
from tfdist.models.layers import POSITION_EMBEDDINGS
from tfdist.runtime.argtypes import check_number


def is_int(value):
    """Whether `value` is an integer (and not a bool).

    Example:

    >>> is_int(3), is_int(True), is_int(3.0)
    (True, False, False)
    """
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def check_transformer_fields(config, int_fields):
    """Checks the fields of a Transformer config dataclass that every size shares.

    `int_fields` must be integers >= 1; `d_model` divisible by `num_heads`;
    `dropout` in [0, 1); `position_embedding` one of `POSITION_EMBEDDINGS`;
    `layer_norm_epsilon` > 0; `gelu` one of `GELU_FORMS`.

    Args:
        config: a dataclass with those fields (`TransformerConfig`,
            `Seq2SeqConfig`); its class name starts every message.
        int_fields: names of the fields that must be integers >= 1.

    Raises:
        ValueError: the first field out of range, with its value and what is
            allowed.

    Example:

    >>> check_transformer_fields(config, ("d_model", "num_heads"))  # doctest: +SKIP
    """
    owner = type(config).__name__
    for name in int_fields:
        value = getattr(config, name)
        if not is_int(value) or value < 1:
            raise ValueError(f"{owner}.{name} must be an integer >= 1, got {value!r}.")
    if config.d_model % config.num_heads:
        divisors = [h for h in range(1, min(config.d_model, 64) + 1) if config.d_model % h == 0]
        raise ValueError(
            f"{owner}.d_model={config.d_model} is not divisible by num_heads="
            f"{config.num_heads}: every head gets d_model / num_heads dimensions. Head counts "
            f"that divide {config.d_model}: {divisors}.")
    dropout = config.dropout
    check_number(f"{owner}.dropout", dropout, at_least=0, below=1)
    if config.position_embedding not in POSITION_EMBEDDINGS:
        raise ValueError(
            f"{owner}.position_embedding={config.position_embedding!r} is not supported; "
            f"choose one of {list(POSITION_EMBEDDINGS)}.")
    epsilon = config.layer_norm_epsilon
    check_number(f"{owner}.layer_norm_epsilon", epsilon, above=0)
    if config.gelu not in GELU_FORMS:
        raise ValueError(
            f"{owner}.gelu must be one of {list(GELU_FORMS)}, got {config.gelu!r}.")
