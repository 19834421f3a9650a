"""Qwen-Image's text encoder (Qwen2.5-VL-7B's language model, 28 layers, random bf16 weights) on one CUDA GPU,
warm: the seconds per encode that `placement.text_encoder: device` costs, beside meshlab's prediction (issue 28).

The pipeline encodes the prompt (and with guidance the negative prompt) once per call, as 34 template tokens plus
the prompt's, and reads the last hidden state. This times that forward at a short prompt and at 512 tokens, one
prompt and two, each the median of CUDA-event timings after warm-up. The config comes from meshlab's card
(meshlab/models/cards/qwen-image.json, as `meshlab models import` read it); weights are drawn on the GPU. JSON on stdout.

    PYTHONPATH=. python3 benchmarks/gpu_text_encode.py > encode.json
"""

from __future__ import annotations

import json
import statistics

TEMPLATE_TOKENS = 34  # what QwenImagePipeline's prompt template puts before the prompt (and drops afterwards)


def main() -> None:
    import torch
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    from meshlab.models.card import load_card

    card = load_card("qwen-image")
    config = dict(card.source["components"]["text_encoder"]["config"])
    text = {k: v for k, v in config.items() if k != "vision_config"}
    vision = dict(config.get("vision_config") or {}, depth=1, fullatt_block_indexes=[0])
    with torch.device("meta"):
        model = Qwen2_5_VLForConditionalGeneration(Qwen2_5_VLConfig(text_config=text, vision_config=vision))
    model = model.to_empty(device="cuda").to(torch.bfloat16).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.02)
    parameters = sum(p.numel() for p in model.model.language_model.parameters())
    results = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
               "language_model_parameters": parameters, "layers": text.get("num_hidden_layers"), "cases": []}
    for prompts, prompt_tokens in ((1, 10), (2, 10), (1, 512), (2, 512)):
        tokens = TEMPLATE_TOKENS + prompt_tokens
        ids = torch.randint(0, 1000, (prompts, tokens), device="cuda")
        mask = torch.ones_like(ids)

        def encode():
            return model(input_ids=ids, attention_mask=mask, output_hidden_states=True).hidden_states[-1]

        with torch.no_grad():
            for _ in range(3):
                encode()
            torch.cuda.synchronize()
            seconds = []
            for _ in range(10):
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                encode()
                end.record()
                torch.cuda.synchronize()
                seconds.append(start.elapsed_time(end) / 1e3)
        results["cases"].append({"prompts": prompts, "tokens_per_prompt": tokens,
                                 "seconds": statistics.median(seconds),
                                 "flops_2n": 2.0 * parameters * prompts * tokens})
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
