"""Published model configurations the importer builds cards from (plain data, no torch).

Each preset copies the Hugging Face repository's ``config.json`` for the transformer and its pipeline
components. They are inputs to ``meshlab.models.importer.card_import``: parameter counts, streams and working sets are
measured from the classes they build, never written here. Keys that change no parameter shape (token ids,
RoPE scaling, latent normalisation constants) are left out where noted.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class ComponentSpec:
    """A pipeline component: which library and class to build, and the config to build it from."""

    library: str  # "diffusers" or "transformers"
    class_name: str
    config: dict
    origin: str  # where the config was published
    #: text encoders: tokens of the pipeline's prompt template encoded before each prompt and dropped from its
    #: embedding (they cost encoder FLOPs, not transformer tokens)
    prompt_prefix_tokens: int = 0

    def to_json(self) -> dict:
        return {"library": self.library, "class": self.class_name, "config": self.config, "origin": self.origin,
                **({"prompt_prefix_tokens": self.prompt_prefix_tokens} if self.prompt_prefix_tokens else {})}


@dataclass(frozen=True)
class Preset:
    """A named model: the diffusers transformer class and config, and the components that ship with it."""

    name: str
    class_name: str
    config: dict
    origin: str
    components: dict[str, ComponentSpec] = field(default_factory=dict)


def _kl16_vae(scaling: float, shift: float, origin: str) -> ComponentSpec:
    """The 16-channel AutoencoderKL that FLUX.1 and SD3.5 share; only the latent normalisation differs."""
    return ComponentSpec(
        "diffusers",
        "AutoencoderKL",
        {
            "in_channels": 3, "out_channels": 3, "latent_channels": 16,
            "block_out_channels": [128, 256, 512, 512], "layers_per_block": 2,
            "down_block_types": ["DownEncoderBlock2D"] * 4, "up_block_types": ["UpDecoderBlock2D"] * 4,
            "act_fn": "silu", "norm_num_groups": 32, "sample_size": 1024,
            "use_quant_conv": False, "use_post_quant_conv": False,
            "scaling_factor": scaling, "shift_factor": shift,
        },
        origin,
    )


#: CLIP ViT-L/14's text tower (FLUX.1 and SD3.5: the pooled prompt embedding).
_CLIP_L = {
    "hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": 12, "num_attention_heads": 12,
    "vocab_size": 49408, "max_position_embeddings": 77, "projection_dim": 768, "hidden_act": "quick_gelu",
}

#: T5 v1.1 XXL's encoder (FLUX.1's `text_encoder_2` and SD3.5's `text_encoder_3`: the per-token prompt embedding).
_T5_XXL_CONFIG = {
    "d_model": 4096, "d_ff": 10240, "d_kv": 64, "num_heads": 64, "num_layers": 24, "vocab_size": 32128,
    "feed_forward_proj": "gated-gelu", "relative_attention_num_buckets": 32, "tie_word_embeddings": False,
}

_QWEN_TEXT_ENCODER = ComponentSpec(
    "transformers",
    "Qwen2_5_VLForConditionalGeneration",
    # Qwen2.5-VL-7B-Instruct; transformers 5 moves the flat text keys into text_config.
    {
        "hidden_size": 3584, "intermediate_size": 18944, "num_hidden_layers": 28, "num_attention_heads": 28,
        "num_key_value_heads": 4, "vocab_size": 152064, "max_position_embeddings": 128000, "rms_norm_eps": 1e-06,
        "hidden_act": "silu", "tie_word_embeddings": False,
        "vision_config": {
            "depth": 32, "hidden_size": 1280, "intermediate_size": 3420, "num_heads": 16, "in_chans": 3,
            "out_hidden_size": 3584, "patch_size": 14, "spatial_merge_size": 2, "temporal_patch_size": 2,
            "window_size": 112, "fullatt_block_indexes": [7, 15, 23, 31], "tokens_per_second": 2,
            "hidden_act": "silu",
        },
    },
    "Qwen/Qwen-Image text_encoder/config.json",
    # diffusers QwenImagePipeline: prompt_template_encode_start_idx = 34, the system prompt's tokens it drops
    prompt_prefix_tokens=34,
)

QWEN_IMAGE = Preset(
    "qwen-image",
    "QwenImageTransformer2DModel",
    {
        "patch_size": 2, "in_channels": 64, "out_channels": 16, "num_layers": 60, "attention_head_dim": 128,
        "num_attention_heads": 24, "joint_attention_dim": 3584, "guidance_embeds": False,
        "axes_dims_rope": [16, 56, 56],
    },
    "Qwen/Qwen-Image transformer/config.json",
    {
        "vae": ComponentSpec(
            "diffusers",
            "AutoencoderKLQwenImage",
            # latents_mean / latents_std (normalisation constants) omitted: the constructor defaults are used.
            {
                "base_dim": 96, "z_dim": 16, "dim_mult": [1, 2, 4, 4], "num_res_blocks": 2, "attn_scales": [],
                "temperal_downsample": [False, True, True], "dropout": 0.0,
            },
            "Qwen/Qwen-Image vae/config.json",
        ),
        "text_encoder": _QWEN_TEXT_ENCODER,
    },
)

FLUX_DEV = Preset(
    "flux-dev",
    "FluxTransformer2DModel",
    {
        "patch_size": 1, "in_channels": 64, "num_layers": 19, "num_single_layers": 38, "attention_head_dim": 128,
        "num_attention_heads": 24, "joint_attention_dim": 4096, "pooled_projection_dim": 768,
        "guidance_embeds": True,
    },
    "black-forest-labs/FLUX.1-dev transformer/config.json",
    {
        "vae": _kl16_vae(0.3611, 0.1159, "black-forest-labs/FLUX.1-dev vae/config.json"),
        # CLIP ViT-L/14 text tower (the pipeline's `text_encoder`, pooled prompt embedding).
        "text_encoder": ComponentSpec("transformers", "CLIPTextModel", _CLIP_L,
                                      "black-forest-labs/FLUX.1-dev text_encoder/config.json"),
        # T5 v1.1 XXL encoder (the pipeline's `text_encoder_2`, per-token prompt embedding).
        "text_encoder_2": ComponentSpec("transformers", "T5EncoderModel", _T5_XXL_CONFIG,
                                        "black-forest-labs/FLUX.1-dev text_encoder_2/config.json"),
    },
)


_WAN_VAE = ComponentSpec(
    "diffusers",
    "AutoencoderKLWan",
    # latents_mean / latents_std omitted: the constructor defaults are Wan 2.1's published values.
    {
        "base_dim": 96, "z_dim": 16, "dim_mult": [1, 2, 4, 4], "num_res_blocks": 2, "attn_scales": [],
        "temperal_downsample": [False, True, True], "dropout": 0.0,
    },
    "Wan-AI/Wan2.1-T2V-14B-Diffusers vae/config.json",
)

#: UMT5-XXL's encoder, the text encoder of every Wan 2.1 pipeline: T5-XXL's shape with a 256,384-token vocabulary.
_UMT5_XXL = ComponentSpec("transformers", "UMT5EncoderModel", {**_T5_XXL_CONFIG, "vocab_size": 256384},
                          "Wan-AI/Wan2.1-T2V-14B-Diffusers text_encoder/config.json")


def _wan(name: str, heads: int, ffn: int, layers: int, repo: str) -> Preset:
    return Preset(
        name,
        "WanTransformer3DModel",
        {
            "patch_size": [1, 2, 2], "num_attention_heads": heads, "attention_head_dim": 128, "in_channels": 16,
            "out_channels": 16, "text_dim": 4096, "freq_dim": 256, "ffn_dim": ffn, "num_layers": layers,
            "cross_attn_norm": True, "qk_norm": "rms_norm_across_heads", "eps": 1e-06, "image_dim": None,
            "added_kv_proj_dim": None, "rope_max_seq_len": 1024,
        },
        f"{repo} transformer/config.json",
        {"vae": _WAN_VAE, "text_encoder": _UMT5_XXL},
    )


#: Wan 2.1 text-to-video (Wan technical report, arXiv:2503.20314, table 1: 1.3B: dim 1536, 12 heads, FFN 8960,
#: 30 layers; 14B: dim 5120, 40 heads, FFN 13824, 40 layers).
WAN_14B = _wan("wan-2.1-t2v-14b", 40, 13824, 40, "Wan-AI/Wan2.1-T2V-14B-Diffusers")
WAN_1_3B = _wan("wan-2.1-t2v-1.3b", 12, 8960, 30, "Wan-AI/Wan2.1-T2V-1.3B-Diffusers")

SD35_LARGE = Preset(
    "sd3.5-large",
    "SD3Transformer2DModel",
    {
        "sample_size": 128, "patch_size": 2, "in_channels": 16, "out_channels": 16, "num_layers": 38,
        "attention_head_dim": 64, "num_attention_heads": 38, "joint_attention_dim": 4096,
        "caption_projection_dim": 2432, "pooled_projection_dim": 2048, "pos_embed_max_size": 192,
        "qk_norm": "rms_norm", "dual_attention_layers": [],
    },
    "stabilityai/stable-diffusion-3.5-large transformer/config.json",
    {
        "vae": _kl16_vae(1.5305, 0.0609, "stabilityai/stable-diffusion-3.5-large vae/config.json"),
        # CLIP ViT-L/14 and OpenCLIP ViT-bigG/14 text towers (pooled and per-token embeddings), then T5-XXL.
        "text_encoder": ComponentSpec("transformers", "CLIPTextModelWithProjection", _CLIP_L,
                                      "stabilityai/stable-diffusion-3.5-large text_encoder/config.json"),
        "text_encoder_2": ComponentSpec(
            "transformers",
            "CLIPTextModelWithProjection",
            {
                "hidden_size": 1280, "intermediate_size": 5120, "num_hidden_layers": 32, "num_attention_heads": 20,
                "vocab_size": 49408, "max_position_embeddings": 77, "projection_dim": 1280, "hidden_act": "gelu",
            },
            "stabilityai/stable-diffusion-3.5-large text_encoder_2/config.json",
        ),
        "text_encoder_3": ComponentSpec("transformers", "T5EncoderModel", _T5_XXL_CONFIG,
                                        "stabilityai/stable-diffusion-3.5-large text_encoder_3/config.json"),
    },
)

FLUX2_DEV = Preset(
    "flux2-dev",
    "Flux2Transformer2DModel",
    {
        "patch_size": 1, "in_channels": 128, "out_channels": None, "num_layers": 8, "num_single_layers": 48,
        "attention_head_dim": 128, "num_attention_heads": 48, "joint_attention_dim": 15360,
        "timestep_guidance_channels": 256, "mlp_ratio": 3.0, "axes_dims_rope": [32, 32, 32, 32], "rope_theta": 2000,
        "eps": 1e-06, "guidance_embeds": True,
    },
    "black-forest-labs/FLUX.2-dev transformer/config.json",
    {
        # the constructor defaults are FLUX.2's VAE: 32 latent channels, patchified 2x2 by the pipeline (128 per token)
        "vae": ComponentSpec("diffusers", "AutoencoderKLFlux2", {}, "black-forest-labs/FLUX.2-dev vae/config.json"),
        # Mistral Small 3.1 24B (text and vision towers); the pipeline reads hidden states of its text tower
        "text_encoder": ComponentSpec(
            "transformers",
            "Mistral3ForConditionalGeneration",
            {
                "text_config": {
                    "model_type": "mistral", "hidden_size": 5120, "intermediate_size": 32768, "num_hidden_layers": 40,
                    "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 131072,
                    "max_position_embeddings": 131072, "rms_norm_eps": 1e-05, "tie_word_embeddings": False,
                },
                "vision_config": {
                    "model_type": "pixtral", "hidden_size": 1024, "intermediate_size": 4096, "num_hidden_layers": 24,
                    "num_attention_heads": 16, "head_dim": 64, "patch_size": 14, "image_size": 1540,
                    "num_channels": 3,
                },
                "spatial_merge_size": 2, "multimodal_projector_bias": False, "projector_hidden_act": "gelu",
            },
            "black-forest-labs/FLUX.2-dev text_encoder/config.json",
        ),
    },
)

#: The presets ``python -m meshlab.models.importer.card_import --all`` turns into the shipped cards, by card name.
PRESETS: dict[str, Preset] = {p.name: p for p in (QWEN_IMAGE, FLUX_DEV, WAN_14B, WAN_1_3B, SD35_LARGE, FLUX2_DEV)}
