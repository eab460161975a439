"""flashc as an attention implementation of Hugging Face transformers.

    import flashc.transformers
    name = flashc.transformers.register()                # "fc_attention"
    model = AutoModelForCausalLM.from_config(config, attn_implementation=name)

The attention function takes the [batch, heads, seqlen, head_dim] tensors that transformers
passes to its attention implementations, reads them in place as [batch, seqlen, heads,
head_dim] views and calls flashc.torch.flash_attn_func (GQA without repeating key/value
heads; causal masks aligned to the bottom-right corner, which is right for a query block
after cached keys). Padding masks, sliding windows and softcapping are refused with a
FlashcError rather than ignored.
"""

from ._lib import FlashcError, Status
from .torch import flash_attn_func

__all__ = ["DEFAULT_NAME", "attention_forward", "register"]

# Not "flashc": transformers takes any implementation name containing "flash" for a
# flash-attention kernel to fetch from its hub.
DEFAULT_NAME = "fc_attention"


def attention_forward(module, query, key, value, attention_mask, dropout=0.0, scaling=None,
                      is_causal=None, **kwargs):
    """An AttentionInterface function: returns (attn_output [batch, seqlen, heads, head_dim],
    None)."""
    if attention_mask is not None:
        raise FlashcError(Status.ERROR_UNSUPPORTED,
                          "attention_mask: padding masks are not supported by flashc yet; "
                          "run unpadded batches")
    for option in ("sliding_window", "softcap"):
        if kwargs.get(option) is not None:
            raise FlashcError(Status.ERROR_UNSUPPORTED,
                              "%s: not supported by the flashc attention implementation yet"
                              % option)
    if is_causal is None:
        is_causal = getattr(module, "is_causal", True)
    out = flash_attn_func(query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2),
                          dropout_p=dropout, softmax_scale=scaling, causal=bool(is_causal))
    return out, None


def register(name=DEFAULT_NAME):
    """Registers attention_forward under `name` in transformers' AttentionInterface, with the
    mask function of transformers' flash-attention integration, which passes no mask when
    there is no padding (so padding is refused by attention_forward rather than dropped).
    Returns the name, for attn_implementation=."""
    if "flash" in name:
        raise ValueError("transformers reads an attn_implementation containing 'flash' as a "
                         "flash-attention kernel to download; pick another name than %r" % name)
    from transformers import AttentionInterface

    AttentionInterface.register(name, attention_forward)
    try:
        from transformers.masking_utils import AttentionMaskInterface, flash_attention_mask
    except ImportError:  # transformers before the mask interface made no mask for new names
        return name
    AttentionMaskInterface.register(name, flash_attention_mask)
    return name
