"""Our Qwen2 runtime against Hugging Face transformers' Qwen2ForCausalLM with identical weights (fp32, CPU)."""
import dataclasses

import pytest
import torch

transformers = pytest.importorskip("transformers")

from workloads.qwen2 import PRESETS, Generator, KVCache, Qwen2ForCausalLM, load_checkpoint  # noqa: E402

TOL = 1e-4


def hf_model(config, seed=0):
    hf_config = transformers.Qwen2Config(
        vocab_size=config.vocab_size, hidden_size=config.hidden_size, intermediate_size=config.intermediate_size,
        num_hidden_layers=config.num_hidden_layers, num_attention_heads=config.num_attention_heads,
        num_key_value_heads=config.num_key_value_heads, rms_norm_eps=config.rms_norm_eps,
        tie_word_embeddings=config.tie_word_embeddings, max_position_embeddings=config.max_position_embeddings,
        rope_theta=config.rope_theta, rope_parameters={"rope_type": "default", "rope_theta": config.rope_theta})
    torch.manual_seed(seed)
    model = transformers.Qwen2ForCausalLM(hf_config).eval()
    with torch.no_grad():  # HF initialises biases and norms to constants; randomise them so they are tested too
        for name, p in model.named_parameters():
            if name.endswith(("bias", "norm.weight")):
                p.add_(torch.randn_like(p) * 0.1)
    return model


def ours_from(hf, config):
    model = Qwen2ForCausalLM(config)
    model.load_state_dict(hf.state_dict(), strict=True)
    return model


@pytest.mark.parametrize("tied", [False, True])
def test_prefill_logits_match(tied):
    config = dataclasses.replace(PRESETS["tiny"], tie_word_embeddings=tied)
    hf = hf_model(config)
    ours = ours_from(hf, config)
    ids = torch.randint(0, config.vocab_size, (3, 17), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        expected = hf(ids).logits
        ours.prepare(32)
        got = ours(ids, torch.arange(17), KVCache(config, 3, 32, "cpu", torch.float32), last_only=False)
    assert got.shape == expected.shape
    assert (got - expected).abs().max().item() <= TOL


def test_decode_steps_match_full_forward():
    """Each cached decode step equals HF's logits for the whole sequence so far, and greedy tokens agree."""
    config = PRESETS["tiny"]
    hf = hf_model(config, seed=3)
    ours = ours_from(hf, config)
    prompt = torch.randint(0, config.vocab_size, (2, 9), generator=torch.Generator().manual_seed(2))
    gen = Generator(ours, batch_size=2, capacity=24)
    gen.prefill(prompt)
    worst = 0.0
    for _ in range(10):
        seq = gen.tokens().clone()
        with torch.inference_mode():
            expected = hf(seq).logits[:, -1]
            got = ours(seq[:, -1:], gen.pos.clone(), gen.cache)
        worst = max(worst, (got - expected).abs().max().item())
        gen.step()
    assert worst <= TOL
    with torch.no_grad():
        hf_tokens = hf.generate(prompt, max_new_tokens=11, do_sample=False, min_new_tokens=11,
                                pad_token_id=0, eos_token_id=None)
    assert torch.equal(gen.tokens(), hf_tokens)


def test_checkpoint_folder_sharded_roundtrip(tmp_path):
    config = PRESETS["tiny"]
    hf = hf_model(config, seed=5)
    hf.save_pretrained(tmp_path, max_shard_size="100KB", safe_serialization=True)
    assert (tmp_path / "model.safetensors.index.json").is_file()
    ours = load_checkpoint(tmp_path, "cpu", torch.float32)
    ids = torch.randint(0, config.vocab_size, (1, 8))
    with torch.inference_mode():
        ours.prepare(8)
        got = ours(ids, torch.arange(8), KVCache(config, 1, 8, "cpu", torch.float32), last_only=False)
        assert (got - hf(ids).logits).abs().max().item() <= TOL
