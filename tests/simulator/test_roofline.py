import pytest

from services.simulator.features import from_groups
from services.simulator.roofline import HARDWARE, RooflineCostModel, kv_capacity_blocks
from services.simulator.shapes import MODEL_SHAPES
from services.simulator.target import from_roofline


def test_kv_capacity_of_llama_2_7b_on_an_a100_is_plausible():
    shape, hw = MODEL_SHAPES["llama-2-7b"], HARDWARE["a100-80g"]
    assert 12.5e9 < shape.weight_bytes < 14e9
    tokens = kv_capacity_blocks(shape, hw, 16) * 16
    assert 90_000 < tokens < 130_000      # vLLM reports about 110k tokens


def test_decode_is_memory_bound_and_prefill_compute_bound():
    shape, hw = MODEL_SHAPES["llama-2-7b"], HARDWARE["a100-80g"]
    model = RooflineCostModel(shape, hw)
    one = model.iteration_s(from_groups([(1, 1, 127)]))
    floor = shape.weight_bytes / hw.memory_bandwidth
    assert floor < one < 3 * floor
    prefill = model.iteration_s(from_groups([(1, 2048, 0)]))
    assert prefill > 2 * 2048 * shape.dense_params / hw.peak_flops
    assert model.iteration_s(from_groups([(64, 1, 511)])) < 2 * one    # batching is cheap


def test_h100_is_faster_and_notes_say_estimate():
    a100, h100 = from_roofline("a100-80g", "llama-2-13b"), from_roofline("h100", "llama-2-13b")
    f = from_groups([(1, 512, 0), (32, 1, 511)])
    assert h100.cost.iteration_s(f) < a100.cost.iteration_s(f)
    assert all("ESTIMATE" in note for note in a100.notes)


def test_unknown_hardware_or_shape():
    with pytest.raises(ValueError, match="unknown hardware"):
        from_roofline("tpu", "llama-2-7b")
    with pytest.raises(ValueError, match="unknown model shape"):
        from_roofline("h100", "gpt-5")


@pytest.mark.parametrize("name,params", [("llama-3.1-8b", 8.03e9), ("qwen2.5-7b", 7.62e9)])
def test_todays_chat_model_shapes_have_their_published_sizes(name, params):
    shape = MODEL_SHAPES[name]
    total = shape.weight_bytes / shape.dtype_bytes
    assert abs(total - params) / params < 0.01
    # Grouped KV heads: a token's KV is a quarter (Llama 3.1) or less of Llama-2-7B's.
    assert shape.kv_bytes_per_token() <= MODEL_SHAPES["llama-2-7b"].kv_bytes_per_token() / 4


def test_llama_3_1_8b_on_an_h100_holds_about_vllms_kv_tokens():
    from services.simulator.roofline import kv_capacity_blocks
    tokens = kv_capacity_blocks(MODEL_SHAPES["llama-3.1-8b"], HARDWARE["h100"], 16) * 16
    assert 380_000 < tokens < 480_000     # 54 GiB of KV at 128 KiB a token
