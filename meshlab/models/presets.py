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
    #: encoders: the keyword arguments the pipeline passes when it encodes (besides the ids and the mask), which
    #: change what the encode holds: ``output_hidden_states=True`` keeps every layer's hidden states to the end
    encode_kwargs: dict = field(default_factory=dict)
    #: encoders: the tokens the pipeline tokenizes every prompt to, padded or cut (CLIP's 77, as FluxPipeline,
    #: StableDiffusion3Pipeline and HunyuanVideoPipeline tokenize with ``padding="max_length"``); 0: the prompt's own
    prompt_tokens: int = 0

    def to_json(self) -> dict:
        return {"library": self.library, "class": self.class_name, "config": self.config, "origin": self.origin,
                **({"prompt_prefix_tokens": self.prompt_prefix_tokens} if self.prompt_prefix_tokens else {}),
                **({"encode_kwargs": self.encode_kwargs} if self.encode_kwargs else {}),
                **({"prompt_tokens": self.prompt_tokens} if self.prompt_tokens else {})}


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

#: T5 v1.1 XXL's encoder (FLUX.1's `text_encoder_2`, SD3.5's `text_encoder_3`, LTX-Video's and CogVideoX's
#: `text_encoder`: the per-token prompt embedding).
_T5_XXL_CONFIG = {
    "d_model": 4096, "d_ff": 10240, "d_kv": 64, "num_heads": 64, "num_layers": 24, "vocab_size": 32128,
    "feed_forward_proj": "gated-gelu", "relative_attention_num_buckets": 32, "tie_word_embeddings": False,
}


def _t5_xxl(origin: str) -> ComponentSpec:
    """T5 v1.1 XXL's encoder as the pipeline at `origin` ships it."""
    return ComponentSpec("transformers", "T5EncoderModel", _T5_XXL_CONFIG, origin)

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
    encode_kwargs={"output_hidden_states": True},  # QwenImagePipeline._get_qwen_prompt_embeds
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
                                      "black-forest-labs/FLUX.1-dev text_encoder/config.json", prompt_tokens=77),
        # T5 v1.1 XXL encoder (the pipeline's `text_encoder_2`, per-token prompt embedding).
        "text_encoder_2": _t5_xxl("black-forest-labs/FLUX.1-dev text_encoder_2/config.json"),
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
        # StableDiffusion3Pipeline._get_clip_prompt_embeds asks both CLIPs for every hidden state (it reads [-2])
        "text_encoder": ComponentSpec("transformers", "CLIPTextModelWithProjection", _CLIP_L,
                                      "stabilityai/stable-diffusion-3.5-large text_encoder/config.json",
                                      encode_kwargs={"output_hidden_states": True}, prompt_tokens=77),
        "text_encoder_2": ComponentSpec(
            "transformers",
            "CLIPTextModelWithProjection",
            {
                "hidden_size": 1280, "intermediate_size": 5120, "num_hidden_layers": 32, "num_attention_heads": 20,
                "vocab_size": 49408, "max_position_embeddings": 77, "projection_dim": 1280, "hidden_act": "gelu",
            },
            "stabilityai/stable-diffusion-3.5-large text_encoder_2/config.json",
            encode_kwargs={"output_hidden_states": True}, prompt_tokens=77,
        ),
        "text_encoder_3": _t5_xxl("stabilityai/stable-diffusion-3.5-large text_encoder_3/config.json"),
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
            # Flux2Pipeline._get_mistral_3_small_prompt_embeds
            encode_kwargs={"output_hidden_states": True, "use_cache": False},
        ),
    },
)

#: Wan 2.1 image-to-video, 14B, 480P (720P has the same transformer). The transformer's config is
#: diffusers' scripts/convert_wan_to_diffusers.py get_transformer_config("Wan-I2V-14B-480p"): the T2V 14B with
#: 36 input channels (16 noise, 4 mask and 16 conditioning latents) and the image context (image_dim,
#: added_kv_proj_dim). The image encoder is CLIP ViT-H/14 (laion/CLIP-ViT-H-14-laion2B-s32B-b79K) as the repository
#: saves it; WanImageToVideoPipeline reads its penultimate hidden states.
WAN_I2V_14B = Preset(
    "wan-2.1-i2v-14b",
    "WanTransformer3DModel",
    {**WAN_14B.config, "in_channels": 36, "image_dim": 1280, "added_kv_proj_dim": 5120, "pos_embed_seq_len": None},
    "Wan-AI/Wan2.1-I2V-14B-480P-Diffusers transformer/config.json (diffusers scripts/convert_wan_to_diffusers.py)",
    {
        "vae": _WAN_VAE,
        "text_encoder": _UMT5_XXL,
        "image_encoder": ComponentSpec(
            "transformers",
            "CLIPVisionModel",
            {
                "hidden_size": 1280, "intermediate_size": 5120, "num_hidden_layers": 32, "num_attention_heads": 16,
                "image_size": 224, "patch_size": 14, "num_channels": 3, "projection_dim": 1024, "hidden_act": "gelu",
                "layer_norm_eps": 1e-05,
            },
            "Wan-AI/Wan2.1-I2V-14B-480P-Diffusers image_encoder/config.json",
            encode_kwargs={"output_hidden_states": True},  # WanImageToVideoPipeline.encode_image reads [-2]
        ),
    },
)

#: LTX-Video 2B, 0.9.0 (Lightricks/LTX-Video; its transformer config is the same for 0.9.0, 0.9.1 and 0.9.5). The
#: 0.9.0 VAE's config file leaves the decoder's keys out: they load as the class's defaults, which are 0.9.0's.
LTX_VIDEO = Preset(
    "ltx-video",
    "LTXVideoTransformer3DModel",
    {
        "activation_fn": "gelu-approximate", "attention_bias": True, "attention_head_dim": 64,
        "attention_out_bias": True, "caption_channels": 4096, "cross_attention_dim": 2048, "in_channels": 128,
        "norm_elementwise_affine": False, "norm_eps": 1e-06, "num_attention_heads": 32, "num_layers": 28,
        "out_channels": 128, "patch_size": 1, "patch_size_t": 1, "qk_norm": "rms_norm_across_heads",
    },
    "Lightricks/LTX-Video transformer/config.json",
    {
        "vae": ComponentSpec(
            "diffusers",
            "AutoencoderKLLTXVideo",
            {
                "block_out_channels": [128, 256, 512, 512], "decoder_causal": False, "encoder_causal": True,
                "in_channels": 3, "latent_channels": 128, "layers_per_block": [4, 3, 3, 3, 4], "out_channels": 3,
                "patch_size": 4, "patch_size_t": 1, "resnet_norm_eps": 1e-06, "scaling_factor": 1.0,
                "spatio_temporal_scaling": [True, True, True, False],
            },
            "diffusers/LTX-Video-0.9.0 vae/config.json (Lightricks' DIFFUSERS_VAE_CONFIG)",
        ),
        "text_encoder": _t5_xxl("Lightricks/LTX-Video text_encoder/config.json"),
    },
)

#: CogVideoX-5b (THUDM/CogVideoX-5b): rotary embeddings, 226 text tokens joined with the video's.
COGVIDEOX_5B = Preset(
    "cogvideox-5b",
    "CogVideoXTransformer3DModel",
    {
        "activation_fn": "gelu-approximate", "attention_bias": True, "attention_head_dim": 64, "dropout": 0.0,
        "flip_sin_to_cos": True, "freq_shift": 0, "in_channels": 16, "max_text_seq_length": 226,
        "norm_elementwise_affine": True, "norm_eps": 1e-05, "num_attention_heads": 48, "num_layers": 42,
        "out_channels": 16, "patch_size": 2, "sample_frames": 49, "sample_height": 60, "sample_width": 90,
        "spatial_interpolation_scale": 1.875, "temporal_compression_ratio": 4, "temporal_interpolation_scale": 1.0,
        "text_embed_dim": 4096, "time_embed_dim": 512, "timestep_activation_fn": "silu",
        "use_rotary_positional_embeddings": True,
    },
    "THUDM/CogVideoX-5b transformer/config.json",
    {
        "vae": ComponentSpec(
            "diffusers",
            "AutoencoderKLCogVideoX",
            {
                "act_fn": "silu", "block_out_channels": [128, 256, 256, 512],
                "down_block_types": ["CogVideoXDownBlock3D"] * 4, "up_block_types": ["CogVideoXUpBlock3D"] * 4,
                "force_upcast": True, "in_channels": 3, "latent_channels": 16, "layers_per_block": 3,
                "norm_eps": 1e-06, "norm_num_groups": 32, "out_channels": 3, "sample_height": 480,
                "sample_width": 720, "scaling_factor": 0.7, "temporal_compression_ratio": 4,
                "use_post_quant_conv": False, "use_quant_conv": False,
            },
            "THUDM/CogVideoX-5b vae/config.json",
        ),
        "text_encoder": _t5_xxl("THUDM/CogVideoX-5b text_encoder/config.json"),
    },
)

#: HunyuanVideo (hunyuanvideo-community/HunyuanVideo): Flux-like dual and single blocks over video latents. Its
#: text encoder is the Llama-3-8B text tower of llava-llama-3-8b-v1_1 (HunyuanVideoPipeline encodes a 95-token
#: template before each prompt and drops it: DEFAULT_PROMPT_TEMPLATE's crop_start), and CLIP ViT-L/14's text tower
#: gives the pooled embedding.
HUNYUAN_VIDEO = Preset(
    "hunyuan-video",
    "HunyuanVideoTransformer3DModel",
    {
        "in_channels": 16, "out_channels": 16, "num_attention_heads": 24, "attention_head_dim": 128,
        "num_layers": 20, "num_single_layers": 40, "num_refiner_layers": 2, "mlp_ratio": 4.0, "patch_size": 2,
        "patch_size_t": 1, "qk_norm": "rms_norm", "guidance_embeds": True, "text_embed_dim": 4096,
        "pooled_projection_dim": 768, "rope_theta": 256.0, "rope_axes_dim": [16, 56, 56],
    },
    "hunyuanvideo-community/HunyuanVideo transformer/config.json",
    {
        "vae": ComponentSpec(
            "diffusers",
            "AutoencoderKLHunyuanVideo",
            {
                "act_fn": "silu", "block_out_channels": [128, 256, 512, 512],
                "down_block_types": ["HunyuanVideoDownBlock3D"] * 4, "up_block_types": ["HunyuanVideoUpBlock3D"] * 4,
                "in_channels": 3, "latent_channels": 16, "layers_per_block": 2, "mid_block_add_attention": True,
                "norm_num_groups": 32, "out_channels": 3, "scaling_factor": 0.476986, "spatial_compression_ratio": 8,
                "temporal_compression_ratio": 4,
            },
            "hunyuanvideo-community/HunyuanVideo vae/config.json",
        ),
        "text_encoder": ComponentSpec(
            "transformers",
            "LlamaModel",
            {
                "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
                "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 128320, "max_position_embeddings": 8192,
                "rms_norm_eps": 1e-05, "rope_theta": 500000.0, "hidden_act": "silu", "tie_word_embeddings": False,
            },
            "hunyuanvideo-community/HunyuanVideo text_encoder/config.json",
            prompt_prefix_tokens=95,
            encode_kwargs={"output_hidden_states": True},  # HunyuanVideoPipeline._get_llama_prompt_embeds
        ),
        "text_encoder_2": ComponentSpec("transformers", "CLIPTextModel", _CLIP_L,
                                        "hunyuanvideo-community/HunyuanVideo text_encoder_2/config.json",
                                        prompt_tokens=77),
    },
)

#: SANA 1.0, 1600M, 1024 px (Efficient-Large-Model/Sana_1600M_1024px_diffusers). The transformer's config.json is
#: the published file (its text read from a verbatim mirror, deAPI-ai/sana16b1024, byte for byte the size the
#: official repository lists at d230cd3; the same as diffusers' scripts/convert_sana_to_diffusers.py makes for
#: SanaMS_1600M_P1_D20 at 1024 px). Its self-attention is ReLU linear attention, its MLP convolutions (GLUMBConv).
#: The VAE is DC-AE f32c32 (mit-han-lab/dc-ae-f32c32-sana-1.0-diffusers), as the SANA repositories' vae/config.json
#: carry it; the class's defaults differ (its upsampling and block types), so every key is given. The text encoder
#: is Gemma-2-2B-IT's decoder (the conversion script saves google/gemma-2-2b-it's ``get_decoder()``, a Gemma2Model);
#: its config is that model's, the architecture keys only.
SANA_1600M = Preset(
    "sana-1600m",
    "SanaTransformer2DModel",
    {
        "attention_bias": False, "attention_head_dim": 32, "caption_channels": 2304, "cross_attention_dim": 2240,
        "cross_attention_head_dim": 112, "dropout": 0.0, "in_channels": 32, "mlp_ratio": 2.5,
        "norm_elementwise_affine": False, "norm_eps": 1e-06, "num_attention_heads": 70, "num_cross_attention_heads": 20,
        "num_layers": 20, "out_channels": 32, "patch_size": 1, "sample_size": 32,
    },
    "Efficient-Large-Model/Sana_1600M_1024px_diffusers transformer/config.json",
    {
        "vae": ComponentSpec(
            "diffusers",
            "AutoencoderDC",
            {
                "attention_head_dim": 32, "decoder_act_fns": "silu",
                "decoder_block_out_channels": [128, 256, 512, 512, 1024, 1024],
                "decoder_block_types": ["ResBlock"] * 3 + ["EfficientViTBlock"] * 3,
                "decoder_layers_per_block": [3, 3, 3, 3, 3, 3], "decoder_norm_types": "rms_norm",
                "decoder_qkv_multiscales": [[], [], [], [5], [5], [5]], "downsample_block_type": "Conv",
                "encoder_block_out_channels": [128, 256, 512, 512, 1024, 1024],
                "encoder_block_types": ["ResBlock"] * 3 + ["EfficientViTBlock"] * 3,
                "encoder_layers_per_block": [2, 2, 2, 3, 3, 3], "encoder_qkv_multiscales": [[], [], [], [5], [5], [5]],
                "in_channels": 3, "latent_channels": 32, "scaling_factor": 0.41407,
                "upsample_block_type": "interpolate",
            },
            "Efficient-Large-Model/Sana_1600M_1024px_diffusers vae/config.json "
            "(mit-han-lab/dc-ae-f32c32-sana-1.0-diffusers)",
        ),
        "text_encoder": ComponentSpec(
            "transformers",
            "Gemma2Model",
            {
                "hidden_size": 2304, "intermediate_size": 9216, "num_hidden_layers": 26, "num_attention_heads": 8,
                "num_key_value_heads": 4, "head_dim": 256, "vocab_size": 256000, "max_position_embeddings": 8192,
                "rms_norm_eps": 1e-06, "rope_theta": 10000.0, "hidden_activation": "gelu_pytorch_tanh",
                "query_pre_attn_scalar": 256, "sliding_window": 4096, "attn_logit_softcapping": 50.0,
                "final_logit_softcapping": 30.0,
            },
            "Efficient-Large-Model/Sana_1600M_1024px_diffusers text_encoder/config.json (google/gemma-2-2b-it's "
            "architecture)",
        ),
    },
)

#: The presets ``python -m meshlab.models.importer.card_import --all`` turns into the shipped cards, by card name.
PRESETS: dict[str, Preset] = {p.name: p for p in (QWEN_IMAGE, FLUX_DEV, WAN_14B, WAN_1_3B, SD35_LARGE, FLUX2_DEV,
                                                  WAN_I2V_14B, LTX_VIDEO, COGVIDEOX_5B, HUNYUAN_VIDEO, SANA_1600M)}
