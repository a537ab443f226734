/* test_bwd_dkv_layout.c - CPU suite bwd_dkv_layout: the sm_90a backward's permuted fp32 dKV
 * accumulator layout 1 (src/kernels.h dsa_bwd_dkv_slot / dsa_bwd_dkv_col, the formula the kernels
 * and the convert pass use):
 *  - at D = 576 and D = 512 every real column maps to exactly one slot in [0, D) and back (bijection,
 *    dsa_bwd_dkv_col the inverse of dsa_bwd_dkv_slot), and every slot stays in its 16-column group;
 *  - the wgmma m64nNk16 accumulator fragment (docs/hopper.md section 2: register i of lane l holds column
 *    8 (i >> 2) + 2 (l % 4) + (i & 1) of row l / 4 + 8 ((i >> 1) & 1)) lands as the kernels store it:
 *    for row half hr and 16-column group g, lane q's registers 8 g + 2 hr + {0, 1, 4, 5} go to the 4
 *    consecutive slots 16 g + 4 q + {0, 1, 2, 3} (one 16-B red.global.add.v4.f32), and the quad's 4
 *    lanes cover slots 16 g .. 16 g + 15 (64 contiguous bytes) exactly once. */
#include "test_common.h"
#include "dsa_testing.h"

static void check_bijection(int D) {
  int *seen = calloc((size_t)D, sizeof(int));
  cr_assert(seen);
  for (int c = 0; c < D; ++c) {
    const int s = dsa_bwd_dkv_slot(c);
    cr_assert(s >= 0 && s < D, "D=%d: column %d -> slot %d out of range", D, c, s);
    cr_assert_eq(s / 16, c / 16, "D=%d: column %d -> slot %d leaves its 16-column group", D, c, s);
    cr_assert_eq(dsa_bwd_dkv_col(s), c, "D=%d: col(slot(%d)) = %d", D, c, dsa_bwd_dkv_col(s));
    ++seen[s];
  }
  for (int s = 0; s < D; ++s) cr_assert_eq(seen[s], 1, "D=%d: slot %d used %d times", D, s, seen[s]);
  free(seen);
}

Test(bwd_dkv_layout, bijection_576_512) {
  check_bijection(576);
  check_bijection(512);
}

Test(bwd_dkv_layout, quad_writes_64_contiguous_bytes) {
  /* one 64-column block (N = 64: 32 registers per lane); the map is the same in every block */
  static const int reg_of_k[4] = {0, 1, 4, 5}; /* + 8 g + 2 hr: the v4's components in order */
  for (int b = 0; b < 9; ++b)
    for (int hr = 0; hr < 2; ++hr)
      for (int g = 0; g < 4; ++g) {
        int hit[16] = {0};
        for (int q = 0; q < 4; ++q)
          for (int k = 0; k < 4; ++k) {
            const int i = 8 * g + 2 * hr + reg_of_k[k];
            cr_assert_eq((i >> 1) & 1, hr, "register %d is not on row half %d", i, hr);
            const int col = 64 * b + 8 * (i >> 2) + 2 * q + (i & 1); /* accumulator map */
            const int s = dsa_bwd_dkv_slot(col);
            cr_assert_eq(s, 64 * b + 16 * g + 4 * q + k,
                         "block %d hr %d g %d lane %d comp %d: column %d -> slot %d, kernel stores %d", b, hr, g,
                         q, k, col, s, 64 * b + 16 * g + 4 * q + k);
            ++hit[s - 64 * b - 16 * g];
          }
        for (int x = 0; x < 16; ++x) cr_assert_eq(hit[x], 1, "group %d slot %d hit %d times", g, x, hit[x]);
      }
  /* the worked example of src/kernels.h: q = 1, g = 2 -> real 34, 35, 42, 43 at slots 36..39 */
  cr_assert_eq(dsa_bwd_dkv_slot(34), 36);
  cr_assert_eq(dsa_bwd_dkv_slot(35), 37);
  cr_assert_eq(dsa_bwd_dkv_slot(42), 38);
  cr_assert_eq(dsa_bwd_dkv_slot(43), 39);
  cr_assert_eq(dsa_bwd_dkv_col(38), 42);
}

/* The quad-pair writes (bwd_sm90_dkv_red in cuda/attn_bwd/bwd_sm90_shared.cuh, sm90_red_block_lay1 in
 * cuda/common/sm90_common.cuh): layout 1's memory order, written by quad pairs. A model
 * of the kernel's lane exchange for one warp and one 64-column block: lane l (quad q = l / 4, j = l % 4,
 * odd = q & 1, peer l ^ 4) holds the accumulator fragment of rows q and q + 8; per row half hr and
 * 32-column pair G it writes, in instruction A, row (odd ? q - 1 : q) and in instruction B row
 * (odd ? q : q + 1), both at slots 64 b + 32 G + 16 odd + 4 j + {0..3}: its own registers 16 G + 8 odd
 * + 2 hr + {0, 1, 4, 5} for its own row, the peer's registers 16 G + 8 (1 - odd) + 2 hr + {0, 1, 4, 5}
 * (received by shfl.xor 4) for the peer's row. Checked: every (row, slot) of the warp's 16 rows is
 * written once with the value of real column dsa_bwd_dkv_col(slot) of that row, and each instruction's
 * 32 lanes write 4 rows x 128 contiguous bytes. */
Test(bwd_dkv_layout, quad_pairs_write_128_contiguous_bytes) {
  static const int reg_of_k[4] = {0, 1, 4, 5};
  for (int b = 0; b < 9; ++b) {
    int hit[16][64] = {{0}};
    for (int hr = 0; hr < 2; ++hr)
      for (int G = 0; G < 2; ++G)
        for (int ins = 0; ins < 2; ++ins) {
          int rows_hit[16] = {0}, bytes[16] = {0}, lo[16], hi[16];
          for (int x = 0; x < 16; ++x) lo[x] = 1 << 30, hi[x] = -1;
          for (int l = 0; l < 32; ++l) {
            const int q = l / 4, j = l % 4, odd = q & 1;
            const int own_row = q + 8 * hr, peer_row = (q ^ 1) + 8 * hr;
            const int writes_own = ins == 0 ? !odd : odd; /* A: even quads' rows; B: odd quads' rows */
            const int row = writes_own ? own_row : peer_row;
            const int src_lane = writes_own ? l : l ^ 4;
            /* the source lane's registers of the group this lane writes (group 2G + odd) */
            const int grp = 2 * G + odd;
            for (int k = 0; k < 4; ++k) {
              const int i = 8 * grp + 2 * hr + reg_of_k[k]; /* register index in the source lane */
              const int src_q = src_lane / 4, src_j = src_lane % 4;
              const int col = 64 * b + 8 * (i >> 2) + 2 * src_j + (i & 1); /* accumulator map */
              const int src_row = src_q + 8 * ((i >> 1) & 1);
              const int s = 64 * b + 32 * G + 16 * odd + 4 * j + k;
              cr_assert_eq(src_row, row, "b %d hr %d G %d ins %d lane %d: value of row %d stored in row %d", b, hr, G,
                           ins, l, src_row, row);
              cr_assert_eq(dsa_bwd_dkv_col(s), col, "b %d lane %d: slot %d holds column %d, expected %d", b, l, s, col,
                           dsa_bwd_dkv_col(s));
              ++hit[row][s - 64 * b];
              bytes[row] += 4;
              if (s < lo[row]) lo[row] = s;
              if (s > hi[row]) hi[row] = s;
            }
            rows_hit[row] = 1;
          }
          int nrows = 0;
          for (int x = 0; x < 16; ++x)
            if (rows_hit[x]) {
              ++nrows;
              cr_assert_eq(bytes[x], 128, "row %d: %d bytes in one instruction", x, bytes[x]);
              cr_assert_eq(hi[x] - lo[x] + 1, 32, "row %d: slots %d..%d not contiguous", x, lo[x], hi[x]);
              cr_assert_eq(lo[x] % 32, 0, "row %d: segment not 128-B aligned in the row", x);
            }
          cr_assert_eq(nrows, 4, "instruction covers %d rows, expected 4", nrows);
        }
    for (int r = 0; r < 16; ++r)
      for (int s = 0; s < 64; ++s) cr_assert_eq(hit[r][s], 1, "block %d row %d slot %d written %d times", b, r, s, hit[r][s]);
  }
}
