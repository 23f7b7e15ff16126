// Does the order of a block's weight tiles in memory bound the decode GEMM's read rate?
//
// The repacked weights are K-step-major: block b's tile of K step s sits at
// (s * tiles + b) * 4 KB, so a block's consecutive steps are tiles * 4 KB apart (1.8 MB on
// 4096 x 28672: a new 2 MB page nearly every step). This kernel reads the same bytes with
// the decode GEMM's access shape (448 blocks of 4 warps, each warp 1 KB of each 4 KB tile
// as two 16-byte loads per thread, `DEPTH` steps in flight in registers) in that order
// ("step-major") and with each block's tiles contiguous ("block-major"), rotating over
// weight copies that together overflow the L2, and prints GB/s for each.
// Build: nvcc -O3 -arch=sm_90 -o stream_pattern benchmarks/stream_pattern.cu
#include <cstdio>
#include <cstdlib>
#include <cuda_runtime.h>

#define CHECK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { \
  printf("CUDA error %s at %s:%d\n", cudaGetErrorString(e), __FILE__, __LINE__); exit(1); } } while (0)

constexpr int TILE = 4096;  // bytes of one block's K-step tile

template <int DEPTH, bool BLOCK_MAJOR>
__global__ void __launch_bounds__(128) stream(const uint4* __restrict__ w, int tiles,
                                              int steps, unsigned* out) {
  const int b = blockIdx.x, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  auto at = [&](int s) -> const uint4* {
    long long tile = BLOCK_MAJOR ? (long long)b * steps + s : (long long)s * tiles + b;
    return w + (tile * TILE + warp * 1024) / 16 + lane;
  };
  uint4 buf[DEPTH][2];
#pragma unroll
  for (int j = 0; j < DEPTH; ++j) {
    buf[j][0] = __ldg(at(j));
    buf[j][1] = __ldg(at(j) + 32);
  }
  unsigned acc = 0;
  for (int s = 0; s < steps; s += DEPTH) {
#pragma unroll
    for (int j = 0; j < DEPTH; ++j) {
      acc ^= buf[j][0].x + buf[j][0].y * 3 + buf[j][0].z * 5 + buf[j][0].w * 7;
      acc ^= buf[j][1].x + buf[j][1].y * 3 + buf[j][1].z * 5 + buf[j][1].w * 7;
      int next = min(s + j + DEPTH, steps - 1);
      buf[j][0] = __ldg(at(next));
      buf[j][1] = __ldg(at(next) + 32);
    }
  }
  if (acc == 0x12345678u) out[b * 128 + threadIdx.x] = acc;  // keeps the loads
}

template <int DEPTH, bool BLOCK_MAJOR>
float run(uint4** copies, int n_copies, int tiles, int steps, unsigned* out) {
  cudaEvent_t a, z;
  CHECK(cudaEventCreate(&a));
  CHECK(cudaEventCreate(&z));
  for (int i = 0; i < n_copies; ++i)
    stream<DEPTH, BLOCK_MAJOR><<<tiles, 128>>>(copies[i], tiles, steps, out);
  CHECK(cudaGetLastError());
  const int reps = 40;
  CHECK(cudaEventRecord(a));
  for (int i = 0; i < reps; ++i)
    stream<DEPTH, BLOCK_MAJOR><<<tiles, 128>>>(copies[i % n_copies], tiles, steps, out);
  CHECK(cudaEventRecord(z));
  CHECK(cudaEventSynchronize(z));
  CHECK(cudaGetLastError());
  float ms;
  CHECK(cudaEventElapsedTime(&ms, a, z));
  return ms * 1e3f / reps;  // us per launch
}

int main(int argc, char** argv) {
  // tiles (blocks) and steps: 4096 x 28672 int4 is 448 tiles of 32 steps
  int tiles = argc > 1 ? atoi(argv[1]) : 448, steps = argc > 2 ? atoi(argv[2]) : 32;
  size_t bytes = (size_t)tiles * steps * TILE;
  int n_copies = (int)((512ull << 20) / bytes) + 1;
  if (n_copies > 64) n_copies = 64;  // 64 copies of >= 8 MB still overflow the L2
  uint4* copies[64];
  for (int i = 0; i < n_copies; ++i) {
    CHECK(cudaMalloc(&copies[i], bytes));
    CHECK(cudaMemset(copies[i], i + 1, bytes));
  }
  unsigned* out;
  CHECK(cudaMalloc(&out, (size_t)tiles * 128 * 4));
  printf("tiles %d steps %d: %.1f MB per launch, %d copies\n", tiles, steps, bytes / 1e6,
         n_copies);
  float t[6] = {run<1, false>(copies, n_copies, tiles, steps, out),
                run<1, true>(copies, n_copies, tiles, steps, out),
                run<2, false>(copies, n_copies, tiles, steps, out),
                run<2, true>(copies, n_copies, tiles, steps, out),
                run<4, false>(copies, n_copies, tiles, steps, out),
                run<4, true>(copies, n_copies, tiles, steps, out)};
  const char* names[6] = {"depth 1 step-major", "depth 1 block-major", "depth 2 step-major",
                          "depth 2 block-major", "depth 4 step-major", "depth 4 block-major"};
  for (int i = 0; i < 6; ++i)
    printf("  %-22s %8.1f us  %7.0f GB/s\n", names[i], t[i], bytes / t[i] / 1e3);
  return 0;
}
