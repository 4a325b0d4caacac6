"""Tensor-parallel layouts of tfdist's own models, as Keras `LayoutMap`s.

Like keras-hub's `Backbone.get_layout_map()`: variable path patterns mapped
to which axis is sharded over the mesh's model axis, for
`Trainer(model, tensor_parallel=K, layout_map=...)`
(`tfdist.training.tensor_parallel`).

Example:

    mesh = keras.distribution.DeviceMesh((2,), ["model"], devices=["gpu:0", "gpu:1"])
    Trainer(model, tensor_parallel=2, layout_map=decoder_lm_layout_map(mesh))
"""

import keras


def decoder_lm_layout_map(device_mesh, model_axis="model"):
    """The Megatron layout of `build_decoder_lm`'s blocks: attention by heads, MLP by channels.

    In every `DecoderBlock`, the self-attention is split by heads (query, key
    and value kernels `(in, heads, head_dim)` as `(None, model, None)`, their
    biases `(model, None)`, the output kernel `(heads, head_dim, out)` as
    `(model, None, None)`, its bias replicated), `ffn_in` (`Dense(d_ff,
    gelu)`) by output channels (column-parallel: kernel `(None, model)`, bias
    `(model,)`) and `ffn_out` (`Dense(d_model)`) by input channels
    (row-parallel: kernel `(model, None)`, bias replicated): one sum of
    partial products per attention and one per MLP, forward. `num_heads` and
    `d_ff` must divide by the size of the model axis. Embeddings, norms and
    the output projection stay replicated.

    Args:
        device_mesh: a `keras.distribution.DeviceMesh` whose `model_axis` has
            K devices.
        model_axis: the name of the mesh axis the layers are split over.

    Returns:
        A `keras.distribution.LayoutMap`.

    Example:

    >>> mesh = keras.distribution.DeviceMesh((2,), ["model"], devices=["cpu:0", "cpu:1"])
    >>> decoder_lm_layout_map(mesh)["block_3/ffn_out/kernel"].axes
    ('model', None)
    """
    layout_map = keras.distribution.LayoutMap(device_mesh)
    layout_map[r"block_\d+/attention/(query|key|value)/kernel"] = (None, model_axis, None)
    layout_map[r"block_\d+/attention/(query|key|value)/bias"] = (model_axis, None)
    layout_map[r"block_\d+/attention/attention_output/kernel"] = (model_axis, None, None)
    layout_map[r"block_\d+/ffn_in/kernel"] = (None, model_axis)
    layout_map[r"block_\d+/ffn_in/bias"] = (model_axis,)
    layout_map[r"block_\d+/ffn_out/kernel"] = (model_axis, None)
    return layout_map
