// evenep/pipeline/vit_calibration.hpp — the ViT block cost model's coefficients (VitCostModel's defaults): the one
// place to edit after a calibration run.
//
// Block: hidden 1280, 16 heads (head dim 80), MLP 5120 (GELU), pre-LayerNorm, SDPA attention, bf16, forward only,
// seconds per image of n patches (small images timed in batches). Cost(n) = a*n + c*n^2 + k seconds.
//
// Refit on the GPU machine with
//   python3 scripts/device/vit_calibrate.py --out vit_calibration.json
// which prints the table of measured vs fitted times and these three lines for pasting.
//
// Measured on the H200 (torch 2.11, 2026-12-01): patches 256 ... 16384, max relative fit error 3.0%; the measured
// backward/forward ratio is 2.79 (median over the sizes), above the model's kVitBackwardRatio = 2 (evenep/pipeline.hpp).
#pragma once

namespace evenep::pipeline {

inline constexpr double kVitCostA = 6.677e-08;  // seconds per patch (projections + MLP)
inline constexpr double kVitCostC = 1.257e-11;  // seconds per patch^2 (attention)
inline constexpr double kVitCostK = 1.821e-07;  // seconds per call (launch overhead)
// Not calibrated by the script (it needs two GPUs): KV of one patch for one block is 2 * 1280 * 2 bytes = 5120 B,
// gathered at an assumed 400 GB/s of NVLink all-gather bandwidth.
inline constexpr double kVitKvSecondsPerPatch = 5120.0 / 400e9;
inline constexpr const char* kVitCalibrationSource = "H200 calibration (scripts/device/vit_calibrate.py, 2026-12-01)";

}  // namespace evenep::pipeline
