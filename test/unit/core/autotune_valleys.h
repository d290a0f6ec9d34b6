// SPDX-License-Identifier: Apache-2.0
// Closed-form step times over the fusion threshold for the autotune tests, a noise model of a
// shared 2-core VM, and a Bayesian-optimisation baseline (Horovod's approach: a Gaussian
// process with expected improvement) to compare the search with. Test-only.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <numbers>
#include <random>
#include <string>
#include <utility>
#include <vector>

namespace tutti::test {

constexpr double kMiB = 1 << 20;

// A step time (arbitrary unit) for each threshold in bytes, and its smallest value.
struct Valley {
  std::string name;
  std::function<double(double)> step_time;
  double best_time = 0;
};

// Linear in log2(threshold) between the points, constant beyond the ends.
inline std::function<double(double)> log_interpolated(std::vector<std::pair<double, double>> pts) {
  return [pts = std::move(pts)](double bytes) {
    const double x = std::log2(bytes / kMiB);
    if (x <= pts.front().first) return pts.front().second;
    if (x >= pts.back().first) return pts.back().second;
    for (std::size_t i = 1; i < pts.size(); ++i) {
      if (x == pts[i].first) return pts[i].second;  // Exact at the points: ties stay ties.
      if (x < pts[i].first) {
        const auto [x0, y0] = pts[i - 1];
        const auto [x1, y1] = pts[i];
        return y0 + (y1 - y0) * (x - x0) / (x1 - x0);
      }
    }
    return pts.back().second;
  };
}

// 1. A smooth valley with its minimum 1 at 1.5 MiB, between two grid points.
// 2. The Intel VM's P1 ratios to raw MPI in a --sweep-fusion run of 2026-11-25 (256 KiB 1.24,
//    1 MiB 1.11, 2 and 4 MiB 1.17, 8 MiB 1.53, 16 MiB 2.3, 64 MiB 4.5; 64 KiB guessed 1.6):
//    2 MiB is 5.4 % worse.
// 3. The AMD VM: flat from 1 to 4 MiB, slowly worse beyond, much worse at 64 MiB.
inline std::vector<Valley> valleys() {
  return {
      {"smooth", [](double b) { return 1 + 0.08 * std::pow(std::log2(b / (1.5 * kMiB)), 2); }, 1},
      {"intel",
       log_interpolated(
           {{-4, 1.6}, {-2, 1.24}, {0, 1.11}, {1, 1.17}, {2, 1.17}, {3, 1.53}, {4, 2.3}, {6, 4.5}}),
       1.11},
      {"amd",
       log_interpolated(
           {{-4, 1.4}, {-2, 1.15}, {0, 1.0}, {1, 1.0}, {2, 1.0}, {3, 1.02}, {4, 1.2}, {6, 2.0}}),
       1.0},
  };
}

// Sample noise: each sample's time is multiplied by 1 + sigma * N(0, 1) (at least 0.3), with
// probability `spike` doubled (another process ran), and by a load factor that changes before
// a sample: drift 1, with probability 0.1 to 1, 1.2 or 1.5; drift 2 (builds starting and
// ending on 2 cores, as seen while developing this), with probability 0.05 to 1 or 3.
// Box-Muller over mt19937_64, so the numbers are the same with every standard library.
class Noise {
 public:
  Noise(std::uint64_t seed, double sigma, double spike, int drift)
      : rng_(seed), sigma_(sigma), spike_(spike), drift_(drift) {}

  // The throughput of one sample of a step that takes `time`.
  double throughput(double time) {
    if (drift_ == 1 && uniform() < 0.1) {
      const double loads[] = {1.0, 1.0, 1.2, 1.5};
      load_ = loads[static_cast<int>(uniform() * 4) % 4];
    } else if (drift_ == 2 && uniform() < 0.05) {
      load_ = uniform() < 0.5 ? 1.0 : 3.0;
    }
    double t = time * load_ * std::max(0.3, 1 + sigma_ * gaussian());
    if (uniform() < spike_) t *= 2;
    return 1 / t;
  }

 private:
  double uniform() { return static_cast<double>(rng_() >> 11) * 0x1.0p-53; }
  double gaussian() {
    const double u = std::max(uniform(), 1e-300);
    return std::sqrt(-2 * std::log(u)) * std::cos(2 * std::numbers::pi * uniform());
  }

  std::mt19937_64 rng_;
  double sigma_, spike_;
  int drift_;
  double load_ = 1.0;
};

// Bayesian optimisation over the same 11-point grid: a Gaussian process on log2(threshold)
// (squared-exponential kernel, length scale 2 octaves, noise 0.1 on standardised throughputs),
// the ends and the middle first, then each sample where expected improvement is highest; the
// answer is the grid point of highest posterior mean. Returns the chosen threshold.
inline double bayes_opt_choice(const std::function<double(double)>& sample, int budget) {
  std::vector<double> grid;
  for (int i = 0; i <= 10; ++i) grid.push_back(65536.0 * (1 << i));
  std::vector<double> xs, ys;
  const auto kernel = [](double a, double b) {
    const double d = (std::log2(a) - std::log2(b)) / 2.0;
    return std::exp(-0.5 * d * d);
  };
  // Posterior means and standard deviations at the grid points; `best` = the best standardised
  // observation.
  const auto posterior = [&](std::vector<double>* mean, std::vector<double>* sd, double* best) {
    const std::size_t n = xs.size();
    double mu = 0, var = 0;
    for (double y : ys) mu += y / static_cast<double>(n);
    for (double y : ys) var += (y - mu) * (y - mu) / static_cast<double>(n);
    const double scale = var > 0 ? std::sqrt(var) : 1;
    std::vector<double> y(n);
    *best = -1e300;
    for (std::size_t i = 0; i < n; ++i) *best = std::max(*best, y[i] = (ys[i] - mu) / scale);
    std::vector<double> l(n * n, 0);  // Cholesky factor of K + 0.1 I.
    for (std::size_t i = 0; i < n; ++i) {
      for (std::size_t j = 0; j <= i; ++j) {
        double s = kernel(xs[i], xs[j]) + (i == j ? 0.1 : 0);
        for (std::size_t m = 0; m < j; ++m) s -= l[i * n + m] * l[j * n + m];
        l[i * n + j] = i == j ? std::sqrt(std::max(s, 1e-12)) : s / l[j * n + j];
      }
    }
    const auto solve = [&](std::vector<double> b) {
      for (std::size_t i = 0; i < n; ++i) {
        for (std::size_t m = 0; m < i; ++m) b[i] -= l[i * n + m] * b[m];
        b[i] /= l[i * n + i];
      }
      for (std::size_t i = n; i-- > 0;) {
        for (std::size_t m = i + 1; m < n; ++m) b[i] -= l[m * n + i] * b[m];
        b[i] /= l[i * n + i];
      }
      return b;
    };
    const std::vector<double> alpha = solve(y);
    mean->clear();
    sd->clear();
    for (double g : grid) {
      std::vector<double> k(n);
      for (std::size_t i = 0; i < n; ++i) k[i] = kernel(g, xs[i]);
      const std::vector<double> v = solve(k);
      double m = 0, reduction = 0;
      for (std::size_t i = 0; i < n; ++i) {
        m += k[i] * alpha[i];
        reduction += k[i] * v[i];
      }
      mean->push_back(m);
      sd->push_back(std::sqrt(std::max(1 - reduction, 1e-12)));
    }
  };
  std::vector<double> mean, sd;
  double best = 0;
  for (int s = 0; s < budget; ++s) {
    double x = s == 0 ? grid[0] : s == 1 ? grid[5] : s == 2 ? grid[10] : 0;
    if (s >= 3) {
      posterior(&mean, &sd, &best);
      double best_ei = -1;
      for (std::size_t i = 0; i < grid.size(); ++i) {
        const double z = (mean[i] - best - 0.01) / sd[i];
        const double ei = (mean[i] - best - 0.01) * 0.5 * std::erfc(-z / std::sqrt(2.0)) +
                          sd[i] * std::exp(-z * z / 2) / std::sqrt(2 * std::numbers::pi);
        if (ei > best_ei) best_ei = ei, x = grid[i];
      }
    }
    xs.push_back(x);
    ys.push_back(sample(x));
  }
  posterior(&mean, &sd, &best);
  return grid[static_cast<std::size_t>(std::max_element(mean.begin(), mean.end()) - mean.begin())];
}

}  // namespace tutti::test
