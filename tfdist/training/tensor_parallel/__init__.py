"""tfdist.training.tensor_parallel: the layers themselves split over the devices of a worker.

Tensor (channel) parallelism in the Megatron pattern, described with Keras's
own `keras.distribution.LayoutMap` / `DeviceMesh`: a Dense layer's kernel
split by output channels (column-parallel) or by input channels
(row-parallel), an EinsumDense along one kernel axis, a MultiHeadAttention
split by heads, a Conv2D split by output channels, an Embedding and the
output projection with its cross-entropy split by vocabulary, over K devices, each
shard a variable on its own device, each shard's computation on that device. Used through
`Trainer(model, tensor_parallel=K, layout_map=...)`:

    mesh = keras.distribution.DeviceMesh((2,), ["model"], devices=["cpu:0", "cpu:1"])
    layout_map = keras.distribution.LayoutMap(mesh)
    layout_map["up/kernel"] = (None, "model")      # column-parallel
    layout_map["down/kernel"] = ("model", None)    # row-parallel
    trainer = Trainer(model, tensor_parallel=2, layout_map=layout_map)

Modules: `layout` (a LayoutMap -> a per-layer `ShardPlan`, refusals),
`layers` (`ShardedDense`, `ShardedMultiHeadAttention`), `conv` (`ShardedConv`), `split`
(the split model, weights in and out, devices, the Trainer's checks), `whole`
(Keras's saving of the split copy writes the model as built, weights and
optimizer state gathered), `einsum` (`ShardedEinsumDense`), `depthwise`
(`ShardedDepthwiseConv`, `ShardedSeparableConv`), `embedding`
(`VocabParallelEmbedding`), `vocab_loss` (the cross-entropy of logits split by
vocabulary), `steps` (the step functions: one split replica per worker, data
parallel across workers).
"""
