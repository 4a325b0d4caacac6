"""tfdist.models: Keras 3 models for tfdist's recipes, and their losses.

Example:

    from tfdist.models import build_decoder_lm, transformer_config
    model = build_decoder_lm(transformer_config("tiny", vocab_size=64, max_len=40))
"""

from tfdist.models.batch_norm import FusedBatchNormalization
from tfdist.models.dropout import BitsDropout, use_bits_dropout
from tfdist.models.layer_norm import LayerNormalization
from tfdist.models.layers import DecoderBlock, PaddingMask, TokenAndPositionEmbedding
from tfdist.models.layout_maps import decoder_lm_layout_map, resnet_layout_map
from tfdist.models.losses import MaskedAccuracy, MaskedSparseCategoricalCrossentropy
from tfdist.models.regularization import (SparseLabelSmoothingCrossentropy, decay_mask,
                                          exclude_from_weight_decay, is_weight_decayed,
                                          no_decay_variables, sparse_label_smoothing_loss)
from tfdist.models.sharded_embedding import ShardedEmbedding
from tfdist.models.resnet import (RESNET_NAMES, build_resnet, resnet_flops_per_example, resnet_name,
                                  resnet_stages)
from tfdist.models.decoding import (beam_search_decode, gnmt_length_penalty, greedy_decode,
                                    sequence_scores)
from tfdist.models.seq2seq import (SEQ2SEQ_SIZES, CrossAttentionDecoderBlock, EncoderBlock,
                                   Seq2SeqConfig, build_seq2seq, seq2seq_config)
from tfdist.models.transformer_lm import (
    TRANSFORMER_SIZES,
    TransformerConfig,
    build_decoder_lm,
    decoder_lm_flops_per_token,
    decoder_lm_matmul_params,
    decoder_lm_param_count,
    transformer_config,
)

__all__ = [
    "BitsDropout",
    "use_bits_dropout",
    "decoder_lm_layout_map",
    "RESNET_NAMES",
    "SEQ2SEQ_SIZES",
    "CrossAttentionDecoderBlock",
    "EncoderBlock",
    "Seq2SeqConfig",
    "beam_search_decode",
    "build_seq2seq",
    "gnmt_length_penalty",
    "greedy_decode",
    "seq2seq_config",
    "sequence_scores",
    "SparseLabelSmoothingCrossentropy",
    "build_resnet",
    "decay_mask",
    "exclude_from_weight_decay",
    "is_weight_decayed",
    "no_decay_variables",
    "resnet_flops_per_example",
    "resnet_name",
    "resnet_stages",
    "resnet_layout_map",
    "sparse_label_smoothing_loss",
    "TRANSFORMER_SIZES",
    "DecoderBlock",
    "FusedBatchNormalization",
    "LayerNormalization",
    "MaskedAccuracy",
    "MaskedSparseCategoricalCrossentropy",
    "PaddingMask",
    "ShardedEmbedding",
    "TokenAndPositionEmbedding",
    "TransformerConfig",
    "build_decoder_lm",
    "decoder_lm_flops_per_token",
    "decoder_lm_matmul_params",
    "decoder_lm_param_count",
    "transformer_config",
]
