// The decode attention's combine of its splits' partial records (attention.cu's attention_decode_mma_kernel), run by
// every CTA of a KV head once its record is written: the last CTA alone, or the last CTAs sharing it in chunks.
#pragma once

#include <cstddef>
#include <cstdint>

#include "backends/cuda/attention.cuh"
#include "backends/cuda/ops_common.cuh"

namespace magnetar::cuda::attn {

enum Combine { kCombineBatches = 0, kCombineChunks = 1, kCombineSpread = 2 };  // Params::combine
// The decode kernel's words per KV head and token in the workspace's tickets: the arrivals (bits 0-15; bit 16 + c:
// chunk c given up by its CTA) and the departures of the combining CTAs.
constexpr int kTicketWords = 2;
constexpr int kMaxCombineChunks = 16;
constexpr unsigned kArrivals = 0xffffu;
// What a decode CTA does after its record: a chunk (>= 0) or one of these.
enum ChunkRole { kNoChunk = -1, kGaveUp = -2, kLastCta = -3 };

// Merges kB split records of one head into a running max m (log2 units), sum l and dims d .. d + 7 of the outputs:
// splits first, first + step, ... (those past n_splits - 1 read the last one's record and count as empty). The
// batch's loads go out together -- every load unconditional, 32-bit offsets, the max and sum (adjacent, 8-byte
// aligned) in one load: this combine is a single warp's instruction chain per scheduler (clock64 stamps at tg128's
// contexts, H200, 2026-12-02: ~5,100 cycles of the last CTA's ~14,300), and with the 32-bit plan (plan_decode_rows)
// tg128 went from 567-569 to 574-575 t/s (docs/benchmarks/2026-12-02-cuda-decode-chain.md) -- then the running max
// moves to the batch's, the sums so far are rescaled and the batch is added.
template <int kB>
__device__ __forceinline__ void merge_records(const float* rec, int stride, int D, int d, int first, int step,
                                              int n_splits, float& m_run, float& l_run, float (&acc)[8]) {
  float ms[kB], ls[kB];
  float4 xa[kB], xb[kB];
#pragma unroll
  for (int b = 0; b < kB; ++b) {
    const int sp = first + b * step;
    const bool in = sp < n_splits;
    const float* r = rec + min(sp, n_splits - 1) * stride;
    const float2 ml = __ldcg(reinterpret_cast<const float2*>(r + D));
    const float4 x0 = __ldcg(reinterpret_cast<const float4*>(r + d));
    const float4 x1 = __ldcg(reinterpret_cast<const float4*>(r + d + 4));
    ms[b] = in ? ml.x : -INFINITY;
    ls[b] = in ? ml.y : 0.0f;
    xa[b] = in ? x0 : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    xb[b] = in ? x1 : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  }
  float m = m_run;
#pragma unroll
  for (int b = 0; b < kB; ++b) m = fmaxf(m, ms[b]);
  const float ref = m == -INFINITY ? 0.0f : m;  // every key so far masked: weights 0, not NaN
  const float alpha = exp2_approx(m_run - ref);
  l_run *= alpha;
#pragma unroll
  for (int e = 0; e < 8; ++e) acc[e] *= alpha;
#pragma unroll
  for (int b = 0; b < kB; ++b) {
    const float w = exp2_approx(ms[b] - ref);
    l_run += w * ls[b];
    acc[0] += w * xa[b].x;
    acc[1] += w * xa[b].y;
    acc[2] += w * xa[b].z;
    acc[3] += w * xa[b].w;
    acc[4] += w * xb[b].x;
    acc[5] += w * xb[b].y;
    acc[6] += w * xb[b].z;
    acc[7] += w * xb[b].w;
  }
  m_run = m;
}

// One token's KV head as combine_splits sees it.
struct SplitCombine {
  const float* partials;  // the workspace's records of head_dim + 4 floats
  size_t records;         // the KV head's first query head's first record there: [group][rec_splits] from it
  size_t records_hi;      // heads group .. heads - 1 (a pair's second token): their records [group][rec_splits]
  unsigned* ticket;       // the head's kTicketWords words (zero between launches)
  int rec_splits;         // records per query head
  int n_splits;           // of them written by this launch (> 1)
  int group;              // query heads of the KV head
  int heads;              // query heads combined: group, or 2 group for a pair of tokens (records_hi)
  int combine;            // Combine
  uint64_t spin_ns;       // how long a waiting CTA waits for the last split before it gives its chunk up
};

// Run by every thread of every split's CTA after its record is written. part_s: shared memory for kWarps * 32 * 10
// floats, free by now. write(h, d, v, item) writes dims d .. d + 7 of query head h (of the group, then of a pair's
// second token), made by item h * D / 8 + d / 8 (a warp's 32 items: a Q8_K block of the output).
template <int kWarps, int D, typename Write>
__device__ __forceinline__ void combine_splits(const SplitCombine& sc, float* part_s, Write&& write) {
  __shared__ int chunk_s;          // the chunk of the combine this CTA takes, or a ChunkRole
  __shared__ unsigned given_up_s;  // the last CTA: the chunks given up before it arrived (bit c)
  const int tid = int(threadIdx.x);
  const int warp = tid / ops::kWarpSize;
  const int lane = tid % ops::kWarpSize;
  const int G = sc.group;
  const int stride = D + 4;
  // Head h's first record.
  auto head_records = [&](int h) {
    const size_t at =
        h < G ? sc.records + size_t(h) * size_t(sc.rec_splits) : sc.records_hi + size_t(h - G) * size_t(sc.rec_splits);
    return sc.partials + at * size_t(stride);
  };

  // The splits' records are combined by the last CTAs of this KV head to finish (the ticket pattern). The barrier
  // orders the CTA's record stores before thread 0's ticket, an acquire-release atomic at GPU scope: the records are
  // visible device-wide before the ticket is taken (release), and a combining CTA sees every other CTA's records once
  // its thread 0 has seen all n_splits tickets taken (acquire; the barrier after it passes that on to its threads,
  // which read the records from L2). The first version fenced (sequentially consistent) in all 128 threads before the
  // ticket and again in the last CTA: 5.73 us per call at 512 rows and 9.07 at 2K, this one 5.55 and 8.81 (H200,
  // attention_bench, the same call).
  //
  // Up to kChunkSplits splits the last CTA combines them alone, kBatch at a time (below). More (long contexts: one
  // wave of CTAs makes up to 33 per KV head on the H200, 5 batches for one CTA) are combined in chunks of 32 items (a
  // Q8_K block of out_q8k each), every warp of a chunk's CTA merging its share of the splits in one batch and warp 0
  // merging the warps' results (the same arithmetic whichever CTA runs a chunk: the same bits). kCombineSpread (the
  // grid fits one wave): the last n_chunks CTAs to finish take a chunk each, the last one its own at once, the others
  // once they have seen (acquire loads of the ticket) every split arrive. A waiting CTA gives its chunk up after
  // spin_ns (the last CTA may not be able to start: an SM limit the launch did not see) by setting its bit in the
  // ticket, and the last CTA runs the chunks whose bits it finds at its arrival, so that no CTA waits on another for
  // long, at no cost when none gives up. Else the last CTA runs them all.
  // H200, attention_bench: 14.3 us per call instead of 15.6 at 16K rows, 38.9 for 41.0 at 64K (Q8_0: 15.0 for 16.4,
  // 35.4 for 38.1); 30B-A3B decode with Q8_0 KV 2-4% faster from the 16K depth (311.7 t/s against 298.6 at 64K), with
  // F16 within +-1%. At 22 splits (~4K and ~8K rows with Q8_0) it was 3% slower, hence kChunkSplits
  // (docs/benchmarks/2026-12-03-cuda-decode-attention-spread-combine.md).
  constexpr int kBatch = 8;
  constexpr int kChunkSplits = 3 * kBatch;  // more splits than this: the chunked combine (see above)
  const int n_splits = sc.n_splits;
  constexpr int kChunkItems = ops::kWarpSize;
  const int n_items = sc.heads * (D / 8);
  const int n_chunks = n_items / kChunkItems;
  const bool chunked = sc.combine != kCombineBatches && n_splits > kChunkSplits && n_items % kChunkItems == 0 &&
                       n_chunks <= n_splits && n_chunks <= kMaxCombineChunks;
  const bool spread = chunked && sc.combine == kCombineSpread;
  __syncthreads();
  unsigned* const ticket = sc.ticket;
  const int first_ticket = spread ? n_splits - n_chunks : n_splits - 1;  // of the first combining CTA
  if (tid == 0) {
    unsigned before;
    asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], 1;" : "=r"(before) : "l"(ticket) : "memory");
    const int mine = int(before & kArrivals) - first_ticket;  // the chunk this CTA combines (spread), or < 0
    chunk_s = mine < 0 ? kNoChunk : int(before & kArrivals) == n_splits - 1 ? kLastCta : mine;
    given_up_s = before >> 16;
    if (spread && chunk_s >= 0) {
      // Until every split has arrived or spin_ns have passed. Then the chunk is given up (a bit in the ticket) unless
      // the last CTA has arrived by then: it runs the chunks whose bits it found at its arrival.
      uint64_t t0, now;
      asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
      unsigned seen;
      do {
        asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(seen) : "l"(ticket) : "memory");
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
      } while ((seen & kArrivals) < unsigned(n_splits) && now - t0 < sc.spin_ns);
      if ((seen & kArrivals) < unsigned(n_splits)) {
        asm volatile("atom.acq_rel.gpu.global.or.b32 %0, [%1], %2;"
                     : "=r"(seen)
                     : "l"(ticket), "r"(1u << (16 + mine))
                     : "memory");
        if ((seen & kArrivals) < unsigned(n_splits)) chunk_s = kGaveUp;  // the last CTA will see the bit
      }
    }
  }
  __syncthreads();
  const int chunk = chunk_s;
  if (chunk == kNoChunk) return;
  if (chunked) {
    // The chunks this CTA runs, in turn: every one (not spread: the last CTA), or its own, and for the last CTA then
    // those given up before it arrived.
    for (int i = 0; i < n_chunks; ++i) {
      int c = i;
      if (spread && i == 0) {
        c = chunk >= 0 ? chunk : chunk == kLastCta ? n_chunks - 1 : kNoChunk;
      } else if (spread) {
        if (chunk != kLastCta) break;
        c = (given_up_s >> (i - 1)) & 1u ? i - 1 : kNoChunk;
      }
      if (c < 0) continue;
      const int item = c * kChunkItems + lane;
      const int h = item / (D / 8), d = 8 * (item % (D / 8));
      const float* rec = head_records(h);
      // Warp w merges splits w, w + kWarps, ... in kChunkBatch-split batches of loads (one batch at up to 33 splits).
      constexpr int kChunkBatch = kWarps >= 12 ? 4 : kWarps >= 8 ? 5 : 9;
      float m_run = -INFINITY, l_run = 0.0f, acc[8];
#pragma unroll
      for (int e = 0; e < 8; ++e) acc[e] = 0.0f;
      for (int sp0 = warp; sp0 < n_splits; sp0 += kChunkBatch * kWarps) {
        merge_records<kChunkBatch>(rec, stride, D, d, sp0, kWarps, n_splits, m_run, l_run, acc);
      }
      float* mine = part_s + (warp * kChunkItems + lane) * 10;
      mine[0] = m_run;
      mine[1] = l_run;
#pragma unroll
      for (int e = 0; e < 8; ++e) mine[2 + e] = acc[e];
      __syncthreads();
      if (warp == 0) {
        float m = -INFINITY;
        for (int w = 0; w < kWarps; ++w) m = fmaxf(m, part_s[(w * kChunkItems + lane) * 10]);
        const float ref = m == -INFINITY ? 0.0f : m;
        float l = 0.0f, out[8];
#pragma unroll
        for (int e = 0; e < 8; ++e) out[e] = 0.0f;
        for (int w = 0; w < kWarps; ++w) {
          const float* x = part_s + (w * kChunkItems + lane) * 10;
          const float f = exp2_approx(x[0] - ref);
          l += f * x[1];
#pragma unroll
          for (int e = 0; e < 8; ++e) out[e] += f * x[2 + e];
        }
#pragma unroll
        for (int e = 0; e < 8; ++e) out[e] = out[e] / l;
        write(h, d, out, item);
      }
      __syncthreads();  // part_s is the next chunk's
    }
    if (tid == 0) {
      if (!spread) {
        *ticket = 0u;
      } else if (atomicAdd(ticket + 1, 1u) == unsigned(n_chunks - 1)) {
        // The last combining CTA to leave sets the head's words back to zero for the next launch (no other CTA reads
        // or writes them any more).
        ticket[0] = 0u;
        ticket[1] = 0u;
      }
    }
    return;
  }
  // Thread i takes 8 dims of one head over every split, in split order and kBatch splits at a time (merge_records). One
  // L2 round trip per batch: 2 for the 10 splits of a 600-row context (the first version found the maxima, then the
  // denominators, then the numerators, 8 splits at a time: 4). H200, attention_bench: 5.78 us per call instead of
  // 7.30 at 512 rows, 9.05 instead of 10.19 at 2K, 17.0 for 18.5 at 16K; tg128 334.2 t/s against 323.5
  // (docs/benchmarks/2026-12-01-cuda-decode-knockouts.md).
  for (int i = tid; i < n_items; i += kWarps * ops::kWarpSize) {
    const int h = i / (D / 8), d = 8 * (i % (D / 8));
    const float* rec = head_records(h);
    float m_run = -INFINITY, l_run = 0.0f, acc[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) acc[e] = 0.0f;
    for (int sp0 = 0; sp0 < n_splits; sp0 += kBatch) {
      merge_records<kBatch>(rec, stride, D, d, sp0, 1, n_splits, m_run, l_run, acc);
    }
#pragma unroll
    for (int e = 0; e < 8; ++e) acc[e] = acc[e] / l_run;
    write(h, d, acc, i);
  }
  if (tid == 0) *ticket = 0u;  // for the next launch (stream order: nothing else reads it meanwhile)
}

}  // namespace magnetar::cuda::attn
