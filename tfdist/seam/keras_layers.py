"""The seam to Keras layers' internals: the layer that drops a
`MultiHeadAttention`'s attention probabilities.

Example:

    from tfdist import seam

    seam.replace_attention_dropout_layer(attention, BitsDropout(0.1))
"""


def attention_dropout_layer(attention):
    """The `Dropout` layer a built `keras.layers.MultiHeadAttention` applies to its
    attention probabilities.

    Private: `MultiHeadAttention._dropout_layer` (made in `_build_attention`
    when the layer is built; no public argument or attribute names it).

    Example:

    >>> attention.build(x_shape, x_shape)
    >>> attention_dropout_layer(attention).rate
    0.1
    """
    return attention._dropout_layer  # noqa: SLF001 - the seam


def replace_attention_dropout_layer(attention, dropout):
    """Makes a built `keras.layers.MultiHeadAttention` drop its attention probabilities
    with the layer `dropout` instead of its own.

    The replaced layer leaves the attention's tracked state (its seed
    generator with it) and `dropout` joins it in the same place, so the
    attention's variables are as many as before and a checkpoint finds them
    under the same names.

    Private: `MultiHeadAttention._dropout_layer` and Keras's layer tracker
    (`Layer._tracker`: `untrack`, `unlock`, `lock`), which refuses new state
    once a layer is built; no public API swaps a built layer's sub-layer.

    Example:

    >>> attention.build(x_shape, x_shape)
    >>> replace_attention_dropout_layer(attention, BitsDropout(0.1))
    """
    tracker = attention._tracker  # noqa: SLF001 - the seam
    locked = tracker.locked
    tracker.unlock()
    try:
        tracker.untrack(attention._dropout_layer)  # noqa: SLF001 - the seam
        attention._dropout_layer = dropout  # noqa: SLF001 - the seam
    finally:
        if locked:
            tracker.lock()
