// Every acceleration of the engine, with its switch; nothing else. Read once per
// run (flags, then MERERUN_* variables for A/B runs) and passed down.
#pragma once

#include <string>

#include "models/model.h"

namespace mere {

struct Levers {
  // One decode step is one CUDA graph replay (token id and position in device
  // memory). Default: its parity test (greedy and seeded sampling identical to
  // the plain loop) passes on the fixtures and the demo model.
  bool cuda_graphs = true;
  // The next decode step is queued before the host reads the previous token
  // (confirmed one step behind; a step past EOS or a stop is rolled back).
  // Default: its parity test (tokens identical to the plain loop, greedy and
  // seeded, with the engine's counters showing it ran) passes.
  bool pipelined_decode = true;
  // The step's last kernel writes the sampled tokens into the host's pinned
  // slots itself (mapped host memory), so no device-to-host copy sits between
  // two graph replays (idle 10-11 -> 1.5 us). Default: the same tokens as the
  // copy (decode loop tests), H100 tg128 Llama-3-8B int4 +0.5%, int8 +0.3%,
  // Qwen3-0.6B +0.9% (docs/levers.md).
  bool kernel_token_slots = true;
  // Q/K/V and gate/up weights concatenated at load, one matmul each (CUDA only:
  // on the CPU it would copy every weight out of the memory-mapped checkpoint).
  bool fused_projections = true;
  // q/k norm, RoPE and the K/V cache write in one kernel instead of up to six.
  bool fused_rope_store = true;
  // With fused_rope_store, decode attention over a dense cache does that
  // kernel's work itself (one sequence, or batches up to 4 with groups up to 4
  // heads, or of 5-8 in wide_attention_blocks' 8-warp blocks): it rotates q
  // (and, in the split holding it, the new key) and writes the new K/V row, one
  // kernel fewer per layer. Default: the same bits (logits of the fixtures, partials and
  // caches of the op), Llama-3-8B int4 decode +3.6% at batch 1 (docs/levers.md).
  bool rope_in_attention = true;
  // Decode attention over a dense cache in blocks of 8 warps instead of 4, each
  // taking the fewest heads of a group whose blocks fit one wave
  // (short contexts, small batches); a decode graph is captured per form. Same
  // quality (demo KL 2e-8), Qwen3-30B-A3B int4 B = 1 +18%, Llama-3-8B +7.5%;
  // groups of 1-2 since the forty-ninth session (Qwen3-0.6B int4 +12%, bf16 +5%)
  // (docs/levers.md).
  bool wide_attention_blocks = true;
  // Where those 8-warp blocks run over at most 2 splits (short contexts; 4 for
  // one sequence whose partials would take the merge kernel), the splits of a
  // head are one thread-block cluster: they merge through distributed shared
  // memory and write the output, so no merge kernel runs. Default: the output
  // within f32 reordering of the merge kernel's (1e-6), Qwen3-30B-A3B int4
  // batch 1 +6.8% over tg64 (+1.4% over tg128), int8 +3.7%, bf16 +6.1%,
  // Llama-3-8B level to +2.7% at 1-4 sequences; 8 sequences -0.4% to -1.1%.
  // Wider clusters (up to 8 splits, the first form) lost up to 16% at 300-500
  // cached tokens (docs/levers.md).
  bool cluster_attention_merge = true;
  // RMSNorm, SwiGLU, attention's split merge and the residual add folded into
  // the decode matvecs' input and output: four kernels fewer per layer and no
  // normalised copy of h (the merge: Llama-3-8B int4 +2.0%, int8 +1.3%).
  // Default `auto`: on where every layer matrix's one-token matvec runs on the
  // tensor cores (MLX affine weights of 2^24 or more: Llama-3-8B int4 +4.2%,
  // int8 +2.9%), where the fused forms are single kernels and logits move within
  // 1e-5; off elsewhere (a 0.6B model's affine weights -7%, bf16 weights
  // slower: docs/levers.md).
  LeverMode fused_norm_matvec = LeverMode::automatic;
  // Programmatic dependent launch: each kernel starts during the previous one's
  // tail, and a matvec loads its first weights before waiting for its input.
  // Default: bit-identical logits and tokens, tg128 +3% (Llama-3-8B) and +27%
  // (Qwen3-0.6B) on the H200.
  bool programmatic_launch = true;
  // Decode matvecs whose rows do not fill the GPU share each row among up to 4
  // warps (split-K), reduced in a fixed order inside the block. Default: greedy
  // parity on the fixtures, tg128 +4.6% (Llama-3-8B), unchanged on Qwen3-0.6B.
  bool matvec_split_k = true;
  // FP8 checkpoints prefill on FP8 tensor cores with the activations quantized to
  // E4M3 per token and 128 columns, as DeepSeek-V3's recipe; off, the weights are
  // dequantized to bf16 for the GEMM. Off by default: it costs accuracy (the
  // qwen3-fp8 fixture's prefill logits move 16% against transformers, 0.4% off).
  bool fp8_activation_gemm = false;
  // Decode matvecs of MLX affine (int8/int4) weights quantize their input to
  // int8 per 32 values (symmetric, as llama.cpp's Q8_1) and sum with dp4a: int4
  // weights are otherwise bound by instructions rather than bytes. Off by
  // default: it costs accuracy (gate in docs/levers.md).
  bool int8_activation_matvec = false;
  // Decode attention over affine8/affine4 KV caches runs on the tensor cores:
  // codes enter f16 mma operands as they are, scales and biases are applied per
  // key outside the sums, q and p s are rounded to f16. (The CUDA-core kernel
  // turns every code into a float first and is bound by instruction issue.)
  // Default within those modes (they stay the user's explicit choice): the
  // modes' audit is unchanged (demo, affine8 KL 3.7e-5 vs 3.8e-5, ppl +0.04% vs
  // +0.03% against bf16) and Llama-3-8B tg128 goes +8% / +8% / +22% at 1k / 8k
  // / 32k context, now faster than bf16 (docs/levers.md).
  bool tensor_core_kv_attention = true;
  // Decode attention over bf16/f16 KV caches on the tensor cores where the
  // CUDA-core kernel would take 4-warp blocks and each split holds more than 64
  // keys (long contexts): q and the softmax weights enter bf16 mma operands as
  // hi + lo pairs (about 16 bits), K and V as cached, sums in f32; within 1e-5
  // of the CPU, greedy tokens the CUDA-core kernel's. (The CUDA-core kernel is
  // bound by its per-key instruction chains there.) Default: Llama-3-8B and
  // Qwen3-30B-A3B int4 decode +3-8% from 4k-8k keys of an 8k cache (docs/levers.md).
  bool tensor_core_attention = true;
  // Decode matvecs of MLX affine (int8/int4) weights on the integer tensor
  // cores, for 2-8 tokens and for one token of a matrix of 2^24 weights or
  // more: u8 codes times three s8 base-256 digits of x (rounded to 23 bits per
  // group), exact s32 sums, scales and biases applied per group in f32. Audit of
  // the demo: KL 4e-8 to 7e-8, greedy 100%; Llama-3-8B int4 +37%, int8 +19% at
  // batch 1, +72-75% at batch 8 (docs/levers.md).
  bool tensor_core_affine_matvec = true;
  // Those tensor-core matvecs, from 2 tokens, take x rounded to 15 bits per
  // group (two s8 digits) instead of 23 (three): a token takes two B columns
  // instead of four, so four tokens share an mma and batches of 3-8 run half the
  // mmas. Default: demo model KL 7e-7 nats, argmax and ppl unchanged (within the
  // audit's parity bounds); Llama-3-8B int4 decode of 3-8 sequences +19-24%,
  // int8 +2-30% (docs/levers.md). One token keeps three digits.
  bool int16_activation_matvec = true;
  // Those tensor-core matvecs (two digits) take steps of 9-16 tokens too, which
  // the prefill GEMM took (batched decode of 9-16 sequences, prompts of 9-16
  // tokens): three or four mmas a step, the weights read once, x rounded to 15
  // bits a group instead of bf16's 8. Default: Llama-3-8B (H100) 12 / 16
  // sequences int4 +51% / +35%, int8 +34% / +26%, pp16 +32% / +25%; closer to
  // the CPU's f32 logits than the GEMM (docs/levers.md).
  bool sixteen_token_matvec = true;
  // The tensor-core affine MoE experts (lever tensor_core_moe_matvec) take steps
  // of 9-16 tokens too, one image a token as at 1-8, where the grouped prefill
  // GEMMs took them (batched decode of 9-16 sequences): the same arithmetic per
  // token, within 1e-5 of the CPU's f32 (the GEMMs round to bf16). Default:
  // Qwen3-30B-A3B (H100) 12 / 16 sequences int4 x4.1 / x3.7, int8 x2.9 / x2.6
  // (docs/levers.md).
  bool sixteen_token_experts = true;
  // FP8 checkpoints' decode matvecs on the tensor cores, for 2-8 tokens and for
  // one token of a matrix of 2^24 weights or more: E4M3 weights as f16 mma
  // operands, x per token and 128 columns as two f16 (22 bits), f32 sums (the
  // CUDA-core kernel multiplies every weight once per token). Default: audit of
  // the demo converted to FP8, KL 1.1e-7 nats, greedy 100%; Llama-3-8B shape
  // +8% at batch 1, x3 at batch 8 (docs/levers.md).
  bool tensor_core_fp8_matvec = true;
  // MoE experts' decode (1-8 tokens) on the tensor cores: MLX affine experts
  // on the integer mma (x and the activations converted once into three s8
  // digits, 23 bits per group, as tensor_core_affine_matvec), FP8 experts on
  // f16 mmas (hi and lo f16, as tensor_core_fp8_matvec); gate/up and down as
  // mma matvecs over each token's chosen experts, down's slots added in order
  // (two prepare kernels more a layer). Default: within 2e-6 of the CPU's f32
  // per op; Qwen3-30B-A3B shape logits within 6e-5 a step, 16 greedy steps the
  // same; int4 +7% at batch 1 and +61% at batch 8, int8 +14% / +50%, fp8 +5% /
  // +19% (docs/levers.md).
  bool tensor_core_moe_matvec = true;
  // Those tensor-core experts (affine and FP8) route each token themselves:
  // every gate/up block computes its token's top-k from the router's logits
  // (the routing kernel's code, the same choice bit for bit) before it waits for
  // the kernel before it, so the routing kernel no longer runs (one launch fewer
  // a MoE layer). Default: bit-identical logits and tokens; Qwen3-30B-A3B shape
  // int4 +5.1% at batch 1, int8 +2.9%, +2-6% at batch 8 (H200), fp8 +3.5% at
  // batch 1, +1.4% at 8 (H100; docs/levers.md).
  bool routing_in_experts = true;
  // Those tensor-core affine experts' matvecs at one token of int8 weights keep
  // five ring stages a warp in flight instead of three, so that a warp's share
  // of a row takes fewer round trips to HBM after routing. The same arithmetic;
  // gate/up's tiles split over more warps, whose f32 sums regroup (within 2e-6
  // of the lever off). Default: Qwen3-30B-A3B shape int8 +4.4% at batch 1 (d512
  // +2.5%); int4 lost with a deeper ring and keeps three; batches of 2-8
  // unchanged (docs/levers.md).
  bool deep_moe_ring = true;
  // The tensor-core affine dense matvec at one token of int8 weights keeps five
  // ring stages a warp in flight instead of three, where its blocks an SM stay
  // the same (down_proj's long row holds one block an SM either way). The same
  // arithmetic (the split-K rule may take more warps a tile in the smaller L1
  // it leaves: f32 sums regroup). Default: Llama-3-8B int8 batch 1 +1.0% (d512
  // +1.1-1.5%), Qwen3-8B int8 +0.4%; int4 lost with a deeper ring and keeps three
  // (docs/levers.md).
  bool deep_dense_ring = true;
  // The tensor-core affine dense matvec at 5-8 tokens of int8 weights (two
  // digits of x), where x's image leaves one block an SM either way, reads 256
  // bytes of each row a stage instead of 128: half the stages for the same
  // weights, so half the per-stage work a warp, and more bytes in flight. The
  // same arithmetic (the split-K rule may choose another split for the fewer,
  // longer stages: f32 sums regroup). Default: Llama-3-8B tg16 int8 +2.8-3.6%
  // at batches of 5-8; int4 measured level and keeps 128 bytes; batches of 1-4
  // untouched (docs/levers.md).
  bool wide_batch_stages = true;
  // That matvec takes a row that no equal cut into at most 8 launches fits
  // (x too long for one block's shared memory) as launches of the same size
  // but the last, which is shorter: Qwen3-4B's down_proj (9,728 columns) at
  // 9-16 tokens in 13 + 13 + 12 stages, where the prefill GEMM took it. The
  // same arithmetic as any cut, closer to the f32 product than the GEMM's bf16.
  // Default since the sixty-fourth session: Qwen3-4B int4 (H100) decodes 16
  // sequences 15% faster and prefills 16 tokens 8-14% faster (docs/levers.md).
  bool uneven_row_cuts = true;
  // The tensor-core MoE experts' int4 stacks in groups of 64 or 128 take the
  // stored bytes, two codes each, as the mma's operand: one mask a word instead
  // of masks and shifts, against x written as y_j = x'_2j+1 and
  // z_j = 16 x'_2j - x'_2j+1 (4 digits each). The same integer sums (16 times
  // them), so the same 23-bit x; only the f32 rounding of the lanes' partials
  // differs. Default: Qwen3-30B-A3B int4 tg64 +1.1% at batch 1, +1.9% at 2;
  // the dense one-token matvec in this form measured level (docs/levers.md).
  bool int4_byte_codes = true;
  // The decode matvecs (affine and FP8 on the tensor cores, affine and
  // bf16/f16/f32 on the CUDA cores, dense and experts) read their weights with
  // an L2 evict-first policy: a token streams gigabytes of weights through
  // L2's 50 MB once, so what a step reads again (activations, norm weights, a
  // short context's K/V rows) stays. A cache hint only: the same bits. Default:
  // tg64 from an empty cache, batch 1, Llama-3-8B int4 +1.2%, int8 +1.0%,
  // bf16 +2.7%, Qwen3-30B-A3B int4 +1.7%, int8 +2.5%; batch 8 -0.1% to +3.8%
  // (docs/levers.md).
  bool streamed_weights = true;
  // Prefill of MLX affine (int8/int4) weights on a GEMM that dequantizes its
  // tiles in registers (wgmma) instead of writing a bf16 copy of each weight
  // first: 9 to 384 tokens of matrices of 2^24 weights or more; longer prompts
  // and smaller matrices keep the copy and cuBLAS, faster there. The same bf16
  // weights (within 3.6e-6 of the CPU product). Default: Llama-3-8B pp64
  // +48-52%, pp256 +10-14%, batched decode of 16-32 sequences +58-63%, pp512
  // and beyond unchanged (docs/levers.md).
  // `on` takes every prefill the kernel supports.
  LeverMode tensor_core_affine_gemm = LeverMode::automatic;
  // The MLX affine MoE experts' prefill on that GEMM (wgmma, the weights formed
  // in registers), grouped by expert: token tiles of one expert's sorted pairs
  // (32, 64 or 128 of them, by the pairs an expert gets on average) against its
  // rows, x gathered and rounded to bf16 by a first kernel, SwiGLU's product by
  // another. Off: the WMMA grouped GEMM that forms bf16 tiles of x and the
  // weights in shared memory. The same bf16 operands (int8 bit-identical).
  // Default: Qwen3-30B-A3B (H100) int4 pp512 +63%, pp2048 +81%, int8 +41% /
  // +73%, batched decode of 24-64 sequences x2.4 (docs/levers.md).
  bool tensor_core_affine_moe_gemm = true;
  // bf16 and FP8 (128 x 128 block scales) MoE experts' prefill on that grouped
  // GEMM too: bf16 rows taken by ldmatrix from the 128-byte swizzle, FP8 values
  // formed in registers as scale * value rounded once to bf16. Off: the WMMA
  // grouped GEMM, with the same bf16 operands and (H100) the same bits.
  // Default: Qwen3-30B-A3B (H100) bf16 pp512 +59%, pp2048 +73%, fp8 +49% /
  // +70%, batched decode of 24-64 sequences x1.7-2.1 (docs/levers.md).
  bool tensor_core_dense_moe_gemm = true;
  // FP8 (128 x 128 block) prefill of up to 256 tokens, and batches of 9-256
  // sequences, on that GEMM: each value times its block's scale rounded once
  // to bf16 in registers. Off: a bf16 copy of every weight each call (5 bytes
  // of traffic a weight against the values' 1), then the dense GEMM; the same
  // bf16 weights, the sums in another order. Default: Llama-3-8B (H100) pp64
  // x2.4, pp128 x2.0, batches of 12 and 32 sequences x2.5 (docs/levers.md).
  bool tensor_core_fp8_gemm = true;
  // The grouped GEMMs' gate and up (MoE experts' prefill, either lever above)
  // as one launch: a block takes 64 columns of gate (warpgroup 0) and of up
  // (warpgroup 1) against its token tile, and its epilogue writes silu(gate) *
  // up in bf16 for down. Off: two launches into f32 products, then the SwiGLU
  // kernel; the same sums, so the same bits. Default: Qwen3-30B-A3B (H100)
  // int4 pp2048 +4.8%, bf16 +6.6%, 24-64 sequences +3-4.5% (docs/levers.md).
  bool grouped_swiglu_epilogue = true;
  // Long steps whose GEMMs are cuBLAS's (bf16/f16 weights from 17 rows; MLX
  // affine and FP8 weights past their dequantizing GEMM's 384 / 256 tokens,
  // through the bf16 copy) fold their norms as decode steps do: each fused
  // form's input, RMSNorm(h) or SwiGLU(gate_up), is formed in bf16 on its way
  // into cuBLAS, which adds into the residual (beta 1): no add_rms_norm or
  // conversion kernels, nor their f32 tensors. Steps the dequantizing GEMM
  // takes compose. Off: the kernels around the GEMMs; each value formed as
  // they form it and the same sums, so the same bits (the dense family; MoE
  // steps compose). Default since the sixty-ninth session (H100, one binary):
  // Llama-3-8B int4 pp512 / pp2048 +5.7% / +7.3%, bf16 +2.7% / +4.6%; the
  // Qwen3-30B-A3B shape level (docs/levers.md).
  bool formed_gemm_input = true;
  // The dequantizing GEMM's split sums (three k-ranges or more: Llama-3-8B's
  // o_proj and down_proj at 64-384 tokens or sequences) added by a kernel of
  // their own over every SM, in split order as before (the same bits). Off: the
  // last split of each tile adds them, one block a tile (32 at 256 tokens),
  // bound by the latency of its reads. Default since the sixty-ninth session
  // (H100, one binary): Llama-3-8B int4 pp64 / pp256 +5.4% / +6.3%, fp8 +4.1% /
  // +6.5%, int4 24 / 64 sequences +3.0% / +5.9% (docs/levers.md).
  bool split_sum_kernel = true;
  // MoE experts' gate and up projections stacked into one matrix per expert at
  // load (replacing the two, not adding a third), so one grouped matmul serves
  // both. Off: measured no faster (Qwen3-30B-A3B shape, H200), bit-identical.
  bool fused_moe_gate_up = false;
  // A new prompt reuses the K/V blocks of the longest prefix an earlier sequence
  // ran on the same block pool (CPU and CUDA states are paged; `text chat` keeps
  // one cache for the conversation). On CUDA a 4,096-token prompt sharing all but
  // 8 tokens prefills in 8.8 ms instead of 124.6 (Llama-3-8B shape). Default:
  // logits after a hit bit-identical to a fresh prefill (f32 and affine8), greedy
  // output identical; demo model, CPU: a 306-token prompt sharing 300 tokens
  // prefills 15 tokens (33 ms vs 1,031 ms).
  bool prefix_cache = true;
  // CPU decode matvecs (1-8 tokens) read the weights as stored (f32/f16/bf16
  // rows, MLX affine int8/int4 codes) into AVX2 registers, 8 at a time, a few
  // rows sharing each load of x, instead of staging 16 rows as f32 in memory
  // first (which pays at prefill, where those rows serve many tokens). Default:
  // audit of the demo (bf16, int8, int4) KL 1e-12 nats, greedy 100%, decode
  // +98% / +156% / +79%; Qwen3-0.6B shape decode x2.2-2.7 (docs/levers.md).
  bool cpu_direct_matvec = true;
  // The CPU's matmuls of more than 8 tokens (prefill) multiply each block of
  // rows, converted (or dequantized) to f32 once, by the tokens in register
  // tiles of 2-4 rows x 4 tokens, instead of one dot product per row and token.
  // Default: audit of the demo (bf16, int8, int4) KL 3e-13 to 6e-13 nats,
  // greedy 100%, prefill +115% / +80% / +83% (docs/levers.md).
  bool cpu_tiled_matmul = true;
  // The CPU's affine decode matvecs (1-8 tokens, MLX int8/int4) as integer dot
  // products on AVX-512 VNNI: x per group rounded to 23 bits as three s8 digits
  // (as tensor_core_affine_matvec on the GPU), codes times digits summed exactly
  // in s32. CPUs without AVX-512 VNNI keep cpu_direct_matvec's f32 kernels.
  // Default: audit of the demo (int4, int8 g64) KL 2.7e-12 nats, greedy 100%,
  // decode +23% / +10%; Qwen3-0.6B shape int4 decode +19% (docs/levers.md).
  bool cpu_vnni_matvec = true;
  // CPU attention by one task per tile (a kv head's query heads at a few
  // tokens, sharing each key and value row; a decode step's keys split into runs
  // where the threads outnumber the kv heads) in AVX2 registers (scores 3-4 keys
  // a step, values 32 dimensions, a prefill's blocks copied into L1, exp by a
  // polynomial) instead of a scalar task per query head and token. Default: audit
  // of the demo KL 2.7e-13 nats, greedy 100%, decode +13%, prefill +11%; Qwen3-0.6B
  // shape int4 decode after 1,024 / 4,096 cached tokens x2.4 / x4.2, a 4,096-token
  // prefill x2.1 with the tiles (docs/levers.md).
  bool cpu_vector_attention = true;
  // The tiled prefill product (cpu_tiled_matmul's f32 rows times the tokens) in
  // 512-bit registers, tiles of 4 rows by 6 tokens, where the CPU has AVX-512F;
  // elsewhere the AVX2 tile. Default: audit of the demo (bf16, int4, int8, fp8)
  // KL 3.0e-13 to 3.2e-13 nats, greedy 100%, prefill +51% / +43% / +44% / +46%;
  // Qwen3-0.6B shape pp512 int4 +53%, bf16 +74% (docs/levers.md).
  bool cpu_avx512_matmul = true;
  // The tiled prefill product as an outer product in 512-bit registers: the
  // tokens packed 16 to a vector once per matmul, each weight broadcast, tiles of
  // 8 rows by 48 tokens with no horizontal sums, the columns in chunks of 512 so
  // a tile's rows stay in L1; at 64 tokens or more where the CPU has AVX-512F,
  // else cpu_avx512_matmul's tiles. Default: audit of the demo (bf16, int4, int8,
  // fp8; prompts of 300-600 tokens) KL 2.7e-12 to 2.9e-12 nats, greedy 100%,
  // prefill +5% to +11%; Qwen3-0.6B shape int4 pp512 / pp2048 +25%, bf16 +13% /
  // +15% (docs/levers.md).
  bool cpu_packed_matmul = true;
  // cpu_vector_attention's prefill tiles (8 query rows or more) as outer
  // products in 512-bit registers where the CPU has AVX-512F: a block of keys
  // packed transposed, 16 keys to a vector, scores 8 rows by 48 keys a step;
  // the weighted values 6 rows by 64 dimensions a step; else the AVX2 tiles.
  // Default: audit of the demo (prompts of 300-600 tokens) KL 1.8e-12 nats,
  // greedy 100%, prefill +5.6% (int4: +9.1%, its runs' ranges overlapping);
  // Qwen3-0.6B shape int4 pp2048 +16%, pp4096 +29% (docs/levers.md).
  bool cpu_avx512_attention = true;

  // MERERUN_CUDA_GRAPHS, MERERUN_PIPELINED_DECODE, MERERUN_FUSED_PROJECTIONS, MERERUN_FUSED_ROPE_STORE,
  // MERERUN_ROPE_IN_ATTENTION, MERERUN_WIDE_ATTENTION_BLOCKS, MERERUN_CLUSTER_ATTENTION_MERGE,
  // MERERUN_FUSED_NORM_MATVEC (0|1|auto), MERERUN_PROGRAMMATIC_LAUNCH, MERERUN_MATVEC_SPLIT_K,
  // MERERUN_FP8_ACTIVATION_GEMM, MERERUN_INT8_ACTIVATION_MATVEC,
  // MERERUN_TENSOR_CORE_KV_ATTENTION, MERERUN_TENSOR_CORE_ATTENTION,
  // MERERUN_TENSOR_CORE_AFFINE_MATVEC, MERERUN_INT16_ACTIVATION_MATVEC, MERERUN_SIXTEEN_TOKEN_MATVEC,
  // MERERUN_SIXTEEN_TOKEN_EXPERTS,
  // MERERUN_TENSOR_CORE_FP8_MATVEC, MERERUN_TENSOR_CORE_MOE_MATVEC, MERERUN_ROUTING_IN_EXPERTS,
  // MERERUN_DEEP_MOE_RING, MERERUN_DEEP_DENSE_RING, MERERUN_WIDE_BATCH_STAGES, MERERUN_UNEVEN_ROW_CUTS,
  // MERERUN_STREAMED_WEIGHTS,
  // MERERUN_INT4_BYTE_CODES,
  // MERERUN_TENSOR_CORE_AFFINE_GEMM (0|1|auto), MERERUN_TENSOR_CORE_AFFINE_MOE_GEMM,
  // MERERUN_TENSOR_CORE_DENSE_MOE_GEMM, MERERUN_TENSOR_CORE_FP8_GEMM, MERERUN_GROUPED_SWIGLU_EPILOGUE,
  // MERERUN_FORMED_GEMM_INPUT, MERERUN_SPLIT_SUM_KERNEL,
  // MERERUN_PSI_FUSED_MOE,
  // MERERUN_PREFIX_CACHE (0|1), MERERUN_CPU_DIRECT_MATVEC, MERERUN_CPU_TILED_MATMUL,
  // MERERUN_CPU_VNNI_MATVEC, MERERUN_CPU_VECTOR_ATTENTION, MERERUN_CPU_AVX512_MATMUL,
  // MERERUN_CPU_PACKED_MATMUL, MERERUN_CPU_AVX512_ATTENTION
  // override the defaults.
  static Levers from_env();
  static Levers all_off() {
    return Levers{.cuda_graphs = false, .pipelined_decode = false, .kernel_token_slots = false,
                  .fused_projections = false, .fused_rope_store = false,
                  .rope_in_attention = false, .wide_attention_blocks = false, .cluster_attention_merge = false,
                  .fused_norm_matvec = LeverMode::off, .programmatic_launch = false, .matvec_split_k = false,
                  .fp8_activation_gemm = false, .int8_activation_matvec = false, .tensor_core_kv_attention = false,
                  .tensor_core_attention = false,
                  .tensor_core_affine_matvec = false, .int16_activation_matvec = false, .sixteen_token_matvec = false,
                  .sixteen_token_experts = false,
                  .tensor_core_fp8_matvec = false, .tensor_core_moe_matvec = false,
                  .routing_in_experts = false, .deep_moe_ring = false, .deep_dense_ring = false,
                  .wide_batch_stages = false, .uneven_row_cuts = false, .int4_byte_codes = false,
                  .streamed_weights = false,
                  .tensor_core_affine_gemm = LeverMode::off,
                  .tensor_core_affine_moe_gemm = false,
                  .tensor_core_dense_moe_gemm = false,
                  .tensor_core_fp8_gemm = false,
                  .grouped_swiglu_epilogue = false,
                  .formed_gemm_input = false,
                  .split_sum_kernel = false,
                  .fused_moe_gate_up = false,
                  .prefix_cache = false,
                  .cpu_direct_matvec = false,
                  .cpu_tiled_matmul = false,
                  .cpu_vnni_matvec = false,
                  .cpu_vector_attention = false,
                  .cpu_avx512_matmul = false,
                  .cpu_packed_matmul = false,
                  .cpu_avx512_attention = false};
  }
  // The levers in effect on `device`, for the line a run prints.
  std::string describe(Device device) const;
  // How a model is laid out on `device` under these levers.
  LoadOptions load_options(Device device) const;
};

}  // namespace mere
