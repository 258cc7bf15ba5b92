/* qwen3.c: the forward pass of Qwen3 (dense). Its block is the llama block; what differs is
 * carried by the weights the loader finds: a per-head RMSNorm of queries and keys before
 * RoPE (q_norm / k_norm in each layer's attention arguments, decoder_attn) and no attention
 * biases. So the step is llama.c's, op for op, on every backend. */
#include "model/decoder.h"

hearth_status qwen3_layers(const op_step *s, const void *ctx) { return llama_layers(s, ctx); }
