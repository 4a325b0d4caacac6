"""Tensor-parallel layouts of tfdist's own models, as Keras `LayoutMap`s.

Like keras-hub's `Backbone.get_layout_map()`: variable path patterns mapped
to which axis is sharded over the mesh's model axis, for
`Trainer(model, tensor_parallel=K, layout_map=...)`
(`tfdist.training.tensor_parallel`).

Example:

    mesh = keras.distribution.DeviceMesh((2,), ["model"], devices=["gpu:0", "gpu:1"])
    Trainer(model, tensor_parallel=2, layout_map=decoder_lm_layout_map(mesh))
    Trainer(resnet, tensor_parallel=2, layout_map=resnet_layout_map(mesh, "resnet50"))
"""

import keras

from tfdist.models.resnet import resnet_stages


def decoder_lm_layout_map(device_mesh, model_axis="model", vocab_size=None):
    """The Megatron layout of `build_decoder_lm`: attention by heads, MLP by channels, the
    output projection by vocabulary.

    In every `DecoderBlock`, the self-attention is split by heads (query, key
    and value kernels `(in, heads, head_dim)` as `(None, model, None)`, their
    biases `(model, None)`, the output kernel `(heads, head_dim, out)` as
    `(model, None, None)`, its bias replicated), `ffn_in` (`Dense(d_ff,
    gelu)`) by output channels (column-parallel: kernel `(None, model)`, bias
    `(model,)`) and `ffn_out` (`Dense(d_model)`) by input channels
    (row-parallel: kernel `(model, None)`, bias replicated): one sum of
    partial products per attention and one per MLP, forward. `num_heads` and
    `d_ff` must divide by the size of the model axis. When the vocabulary
    divides by K, the token embedding's table is split by rows (each device
    looks up its slice of the vocabulary; the K partial lookups are summed)
    and the output projection `lm_head` (`Dense(vocab_size)`) by vocabulary
    (column-parallel: each device computes the logits of its slice, and the
    training loss reads them slice by slice without gathering them,
    `tfdist.training.tensor_parallel.vocab_loss`). Position embeddings and
    norms stay replicated.

    Args:
        device_mesh: a `keras.distribution.DeviceMesh` whose `model_axis` has
            K devices.
        model_axis: the name of the mesh axis the layers are split over.
        vocab_size: the model's vocabulary; the token embedding and `lm_head`
            stay replicated when it does not divide by K (None: split them; K
            must divide it).

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
    shards = dict(zip(device_mesh.axis_names, device_mesh.shape, strict=True)).get(model_axis, 1)
    if vocab_size is None or vocab_size % shards == 0:
        layout_map["embedding/token_embedding/embeddings"] = (model_axis, None)
        layout_map["lm_head/kernel"] = (None, model_axis)
        layout_map["lm_head/bias"] = (model_axis,)
    return layout_map


def resnet_layout_map(device_mesh, model_name="resnet_tiny", model_axis="model"):
    """The layout of `build_resnet(model_name, ...)`: its widest convolutions split by filters.

    Every convolution of the last (widest) stage, `stage<N>_block<b>_conv<c>`
    and the projection `stage<N>_block1_proj_conv`, has its kernel
    `(kh, kw, in, filters)` laid out `(None, None, None, model)`: each device
    computes its share of the output channels, gathered on the first device
    for the batch norm after it (not split). The stage's widths (64 filters
    for resnet_tiny, 512 or 2048 for the others) must divide by the size of
    the model axis. Everything else is replicated.

    Args:
        device_mesh: a `keras.distribution.DeviceMesh` whose `model_axis` has K devices.
        model_name: the ResNet (a name or depth `resnet_name` accepts).
        model_axis: the name of the mesh axis the convolutions are split over.

    Returns:
        A `keras.distribution.LayoutMap`.

    Example:

    >>> mesh = keras.distribution.DeviceMesh((2,), ["model"], devices=["cpu:0", "cpu:1"])
    >>> resnet_layout_map(mesh, "resnet_tiny")["stage3_block1_conv2/kernel"].axes
    (None, None, None, 'model')
    """
    last = resnet_stages(model_name)
    layout_map = keras.distribution.LayoutMap(device_mesh)
    layout_map[rf"stage{last}_block\d+_(conv\d|proj_conv)/kernel"] = (None, None, None, model_axis)
    return layout_map
