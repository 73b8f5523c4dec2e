# Converts a checkpoint's linear weights (q/k/v/o, gate/up/down, lm_head) to FP8 E4M3 with 128x128
# block scales (the Qwen3-FP8 / DeepSeek-V3 layout: WEIGHT and WEIGHT_scale_inv, quantization_config
# fp8), with PyTorch's E4M3 cast: the FP8 demo the tensor_core_fp8_matvec gate ran on (twelfth session,
# before `mere quantize --format fp8` existed; that command writes the same layout, embeddings dense
# as here). Needs PyTorch and safetensors (the GPU machine has both).
# Usage: python3 scripts/fp8_convert.py IN_DIR OUT_DIR
import json, shutil, sys
import torch
import safetensors.torch as st
src, dst = sys.argv[1], sys.argv[2]
shutil.copytree(src, dst, ignore=shutil.ignore_patterns("model.safetensors", "draft"))
out = {}
for k, v in st.load_file(f"{src}/model.safetensors").items():
    if k.endswith(".weight") and v.dim() == 2 and ("proj" in k or k == "lm_head.weight"):
        v = v.float()
        o, i = v.shape
        bo, bi = (o + 127) // 128, (i + 127) // 128
        pad = torch.zeros(bo * 128, bi * 128)
        pad[:o, :i] = v
        blocks = pad.view(bo, 128, bi, 128)
        scale = blocks.abs().amax(dim=(1, 3)).clamp(min=1e-12) / 448.0
        q = (blocks / scale[:, None, :, None]).to(torch.float8_e4m3fn)
        out[k] = q.reshape(bo * 128, bi * 128)[:o, :i].contiguous()
        out[k + "_scale_inv"] = scale.float().contiguous()
    else:
        out[k] = v
st.save_file(out, f"{dst}/model.safetensors", metadata={"format": "pt"})
cfg = json.load(open(f"{dst}/config.json"))
cfg["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                              "weight_block_size": [128, 128]}
json.dump(cfg, open(f"{dst}/config.json", "w"), indent=1)
print("wrote", dst, len(out), "tensors")
