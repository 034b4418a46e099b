"""The tiny ModernBERT that the demo, the tests and the benchmarks train: built from its config, no download."""

from __future__ import annotations

from transformers import ModernBertConfig


def tiny_modernbert_config(
    vocab_size: int = 8192,
    hidden_size: int = 128,
    num_layers: int = 4,
    num_heads: int = 4,
    seq_len: int = 128,
    pad_token_id: int = 0,
    cls_token_id: int = 1,
    sep_token_id: int = 2,
) -> ModernBertConfig:
    """A small ModernBERT config (the defaults give ~1.7 M parameters) for masked-LM training.

    Args:
        vocab_size: Tokenizer vocabulary size.
        hidden_size: Hidden width; the MLP is twice as wide.
        num_layers: Encoder layers.
        num_heads: Attention heads.
        seq_len: Longest sequence (``max_position_embeddings``).
        pad_token_id: The tokenizer's padding id.
        cls_token_id: The tokenizer's ``[CLS]`` id (also used as BOS).
        sep_token_id: The tokenizer's ``[SEP]`` id (also used as EOS).

    Returns:
        The config; ``ModernBertForMaskedLM(config)`` builds the model.
    """
    return ModernBertConfig(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        intermediate_size=2 * hidden_size,
        max_position_embeddings=seq_len,
        pad_token_id=pad_token_id,
        bos_token_id=cls_token_id,
        eos_token_id=sep_token_id,
        cls_token_id=cls_token_id,
        sep_token_id=sep_token_id,
    )
