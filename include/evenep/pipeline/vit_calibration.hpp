// evenep/pipeline/vit_calibration.hpp — the ViT block cost model's coefficients (VitCostModel's defaults): the one
// place to edit after a calibration run.
//
// Block: hidden 1280, 16 heads (head dim 80), MLP 5120 (GELU), pre-LayerNorm, SDPA attention, bf16, one image of
// n patches per call, forward only. Cost(n) = a*n + c*n^2 + k seconds.
//
// Refit on the GPU machine with
//   python3 scripts/device/vit_calibrate.py --out vit_calibration.json
// which prints the table of measured vs fitted times and these three lines for pasting.
//
// NOTE: until the GPU run is checked in, a, c and k are FLOP estimates for an H200, not measurements:
// a = 24*h^2 FLOP per patch at 600 TFLOP/s, c = 4*h FLOP per patch pair at 400 TFLOP/s, k = 30 us of launches.
#pragma once

namespace evenep::pipeline {

inline constexpr double kVitCostA = 6.55e-08;  // seconds per patch (projections + MLP)
inline constexpr double kVitCostC = 1.28e-11;  // seconds per patch^2 (attention)
inline constexpr double kVitCostK = 3.0e-05;   // seconds per call (launch overhead)
// Not calibrated by the script (it needs two GPUs): KV of one patch for one block is 2 * 1280 * 2 bytes = 5120 B,
// gathered at an assumed 400 GB/s of NVLink all-gather bandwidth.
inline constexpr double kVitKvSecondsPerPatch = 5120.0 / 400e9;
inline constexpr const char* kVitCalibrationSource = "FLOP estimate (not yet calibrated)";

}  // namespace evenep::pipeline
