/* The C API: warm a kernel ahead of time and read errors. A real call passes
 * device pointers from cudaMalloc (or a framework) in jitattn_tensor views. */
#include <jitattn/jitattn.h>
#include <stdio.h>

static jitattn_tensor bshd(void* data, int64_t b, int64_t s, int64_t h, int64_t d) {
  jitattn_tensor t = {data, JITATTN_BF16, 4, {b, s, h, d}, {s * h * d, h * d, d, 1}};
  return t;
}

int main(void) {
  printf("jitattn %s\n", jitattn_version());
  if (jitattn_warm("fwd.bf16.d128.br128.bc64.w4.causal", "sm_90a") != JITATTN_OK) {
    fprintf(stderr, "warm failed: %s\n", jitattn_last_error());
    return 1;
  }
  printf("warmed fwd.bf16.d128.br128.bc64.w4.causal for sm_90a\n");

  /* A call with 6 KV heads for 32 query heads is rejected before any launch. */
  jitattn_tensor q = bshd((void*)0x1000, 1, 128, 32, 128);
  jitattn_tensor k = bshd((void*)0x2000, 1, 128, 6, 128);
  jitattn_tensor out = bshd((void*)0x3000, 1, 128, 32, 128);
  jitattn_fwd_options options;
  jitattn_fwd_options_init(&options);
  options.causal = 1;
  jitattn_status status = jitattn_fwd(&q, &k, &k, &out, NULL, &options, NULL);
  printf("bad call -> status %d: %s\n", (int)status, jitattn_last_error());
  return status == JITATTN_ERROR_INVALID_ARGUMENT ? 0 : 1;
}
