"""`check_packing`: a model that carries one packed sample's state into the next is refused, loudly.

Tiny random transformers models (no download).  Attention keeps packed samples apart (the leak is 0.0);
Bamba (Mamba-2 layers), Jamba (Mamba layers) and LFM2 (short convolutions) do not on their CPU paths,
and nothing in their output says so; Qwen3-Next refuses packed rows itself without flash-linear-attention.
A Llama given a packed row without ``use_cache=False`` mixes its samples too (the trap `packed_collate`
closes; transformers' ``DataCollatorWithFlattening`` leaves it open while the model's config keeps
``use_cache=True``), and the probe catches that as well.
"""

import functools

import pytest
import torch

from odb.batching import check_packing, mrope_collate, packed_collate, pad_collate
from odb.errors import ConfigError

pytestmark = pytest.mark.adapters

SMALL = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2)


def _llama(attn="sdpa"):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(**SMALL, max_position_embeddings=64, attn_implementation=attn))


def _bamba():
    from transformers import BambaConfig, BambaForCausalLM

    torch.manual_seed(0)
    return BambaForCausalLM(BambaConfig(**SMALL, attn_layer_indices=[1], mamba_n_heads=4, mamba_d_head=16,
                                        mamba_n_groups=1, mamba_d_state=8, mamba_chunk_size=4))


def _jamba():
    from transformers import JambaConfig, JambaForCausalLM

    torch.manual_seed(0)
    return JambaForCausalLM(JambaConfig(**SMALL, attn_layer_period=2, attn_layer_offset=1, expert_layer_period=4,
                                        mamba_d_state=8, mamba_expand=2, use_mamba_kernels=False))


def _lfm2():
    from transformers import Lfm2Config, Lfm2ForCausalLM

    torch.manual_seed(0)
    return Lfm2ForCausalLM(Lfm2Config(**SMALL, layer_types=["conv", "full_attention"]))


def _qwen3_next():
    from transformers import Qwen3NextConfig, Qwen3NextForCausalLM

    torch.manual_seed(0)
    return Qwen3NextForCausalLM(Qwen3NextConfig(
        **SMALL, head_dim=8, linear_num_value_heads=4, linear_num_key_heads=2, linear_key_head_dim=8,
        linear_value_head_dim=8, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16,
        shared_expert_intermediate_size=16, layer_types=["linear_attention", "full_attention"]))


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_attention_keeps_packed_samples_apart_and_the_models_mode_is_restored(attn):
    model = _llama(attn)
    assert model.training
    assert check_packing(model) == 0.0
    assert model.training
    model.eval()
    assert check_packing(model, lengths=(4, 11, 2, 5)) == 0.0
    assert not model.training


@pytest.mark.parametrize("build, leak_at_least", [(_bamba, 0.05), (_jamba, 1e-4), (_lfm2, 1e-4)],
                         ids=["bamba", "jamba", "lfm2"])
def test_a_model_whose_layers_carry_state_across_samples_is_refused(build, leak_at_least):
    model = build()
    with pytest.raises(ConfigError, match="mixes the samples of a packed batch") as e:
        check_packing(model)
    leak = float(str(e.value).split("logits by ")[1].split(" of")[0])
    assert leak >= leak_at_least  # far above the tolerance (1e-5): what was measured, not noise
    assert model.training  # restored after the failure too
    # the same model with padded rows: nothing crosses a row (Jamba's reference scan: 4e-8, rounding)
    assert check_packing(model, pad_collate) < 1e-6
    # and a tolerance above the measured leak lets it pass (the figure returned is the same one)
    assert check_packing(model, tol=1.0) == pytest.approx(leak, rel=1e-2)


def test_a_packed_row_without_use_cache_false_mixes_an_attention_models_samples_and_is_refused():
    with pytest.raises(ConfigError, match="mixes the samples"):
        check_packing(_llama("sdpa"), functools.partial(packed_collate, use_cache_key=False))


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_hf_flattening_collator_mixes_samples_while_the_models_config_keeps_its_kv_cache(attn):
    from transformers import DataCollatorWithFlattening

    model = _llama(attn)
    assert model.config.use_cache  # the default: a cache is built, and packed-row detection is off
    with pytest.raises(ConfigError, match="mixes the samples"):
        check_packing(model, DataCollatorWithFlattening())
    model.config.use_cache = False
    assert check_packing(model, DataCollatorWithFlattening()) == 0.0


def test_a_model_that_refuses_packed_rows_gets_a_config_error_naming_its_own():
    with pytest.raises(ConfigError, match="refused a packed batch") as e:
        check_packing(_qwen3_next())
    assert e.value.__cause__ is not None and "flash-linear-attention" in str(e.value)


def test_an_mrope_vision_language_model_keeps_packed_samples_apart():
    from test_vlm import _model

    model = _model()
    assert check_packing(model, mrope_collate(model.model.get_rope_index)) == 0.0


@pytest.mark.parametrize("kwargs, msg", [
    (dict(lengths=(5,)), "at least 2 sample lengths"),
    (dict(lengths=(5, 0)), "at least 2 sample lengths"),
    (dict(vocab_size=1), "at least 2 tokens"),
])
def test_a_probe_that_could_not_measure_is_refused(kwargs, msg):
    with pytest.raises(ConfigError, match=msg):
        check_packing(_llama(), **kwargs)


def test_a_model_without_a_vocabulary_or_logits_is_refused():
    class Plain(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Embedding(8, 4)

        def forward(self, input_ids, **kw):
            return {"hidden": self.emb(input_ids)}

    with pytest.raises(ConfigError, match="no vocab_size"):
        check_packing(Plain())
    with pytest.raises(ConfigError, match="no logits"):
        check_packing(Plain(), vocab_size=8)
