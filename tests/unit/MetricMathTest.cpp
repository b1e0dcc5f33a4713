// FID and KID against their definitions: FID of a set with itself, of a shifted set, and of
// two Gaussians with diagonal covariances (a closed form); KID against its double sum written
// out pair by pair; the moments against StyleGAN's raw-moment formula, element by element.
#include "runtime/metrics/MetricMath.h"

#include <gtest/gtest.h>

#include <cmath>

using namespace ganc::runtime;

namespace {

at::Tensor randomFeatures(int64_t n, int64_t f, uint64_t seed) {
  auto g = at::detail::createCPUGenerator(seed);
  // Correlated features: a random mix of independent ones, plus a nonlinearity.
  at::Tensor x = at::randn({n, f}, g, at::kDouble);
  return at::cos(x.matmul(at::randn({f, f}, g, at::kDouble) / std::sqrt(double(f))));
}

double polynomialKernel(const at::Tensor &a, const at::Tensor &b) {
  return std::pow(a.dot(b).item<double>() / static_cast<double>(a.size(0)) + 1, 3);
}

} // namespace

TEST(FeatureMoments, AreStyleGansRawMoments) {
  const at::Tensor x = randomFeatures(40, 5, 1);
  FeatureMoments m = featureMoments(x.to(at::kFloat));
  const at::Tensor xf = x.to(at::kFloat).to(at::kDouble);
  for (int64_t i = 0; i < 5; ++i)
    for (int64_t j = 0; j < 5; ++j) {
      double sum = 0, mi = 0, mj = 0;
      for (int64_t k = 0; k < 40; ++k) {
        sum += xf[k][i].item<double>() * xf[k][j].item<double>();
        mi += xf[k][i].item<double>();
        mj += xf[k][j].item<double>();
      }
      EXPECT_NEAR(m.covariance[i][j].item<double>(), sum / 40 - (mi / 40) * (mj / 40), 1e-12);
    }
  EXPECT_EQ(m.count, 40);
}

TEST(FrechetDistance, OfASetWithItselfIsZero) {
  FeatureMoments m = featureMoments(randomFeatures(600, 64, 2));
  const double scale = m.covariance.trace().item<double>();
  EXPECT_NEAR(frechetDistance(m, m), 0.0, 1e-9 * scale);
}

TEST(FrechetDistance, GrowsByTheSquaredShiftOfTheMean) {
  const at::Tensor x = randomFeatures(600, 64, 3);
  const at::Tensor shift = at::linspace(-0.5, 0.5, 64, at::kDouble);
  const double fid = frechetDistance(featureMoments(x), featureMoments(x + shift));
  EXPECT_NEAR(fid, shift.square().sum().item<double>(), 1e-9);
}

TEST(FrechetDistance, OfDiagonalGaussiansHasItsClosedForm) {
  // N(mu_a, diag(a)) and N(mu_b, diag(b)): |mu_a - mu_b|^2 + sum(a + b - 2 sqrt(a b)).
  const at::Tensor a = at::linspace(0.1, 3.0, 32, at::kDouble);
  const at::Tensor b = at::linspace(2.0, 0.5, 32, at::kDouble);
  FeatureMoments p{at::zeros({32}, at::kDouble), at::diag(a), 100};
  FeatureMoments q{at::full({32}, 0.25, at::kDouble), at::diag(b), 100};
  const double expected = 32 * 0.0625 + (a + b - 2 * (a * b).sqrt()).sum().item<double>();
  EXPECT_NEAR(frechetDistance(p, q), expected, 1e-10 * expected);
  EXPECT_NEAR(frechetDistance(q, p), expected, 1e-10 * expected);
}

TEST(KernelInceptionDistance, IsTheUnbiasedMmdWrittenOutPairByPair) {
  const at::Tensor x = randomFeatures(30, 8, 4), y = randomFeatures(30, 8, 5) + 0.3;
  double xx = 0, yy = 0, xy = 0;
  for (int64_t i = 0; i < 30; ++i)
    for (int64_t j = 0; j < 30; ++j) {
      if (i != j) {
        xx += polynomialKernel(x[i], x[j]);
        yy += polynomialKernel(y[i], y[j]);
      }
      xy += polynomialKernel(x[i], y[j]);
    }
  const double expected = (xx + yy) / (30.0 * 29.0) - 2 * xy / (30.0 * 30.0);
  // Subsets as large as both sets: every one is the whole, in another order.
  EXPECT_NEAR(kernelInceptionDistance(x, y, 100, 1000), expected, 1e-12 * std::abs(expected));
  EXPECT_NEAR(
      kernelInceptionDistance(x.to(at::kFloat), y.to(at::kFloat), 7, 30),
      kernelInceptionDistance(x.to(at::kFloat).to(at::kDouble), y.to(at::kFloat).to(at::kDouble)),
      1e-12 * std::abs(expected));
}

TEST(KernelInceptionDistance, AveragesSubsetsOfTheLargerSets) {
  const at::Tensor all = randomFeatures(500, 8, 6); // one distribution, two samples of it
  const at::Tensor x = all.narrow(0, 0, 200), y = all.narrow(0, 200, 300);
  const at::Tensor shifted = y + 0.5;
  const double same = kernelInceptionDistance(x, y, 50, 100, 0);
  const double apart = kernelInceptionDistance(x, shifted, 50, 100, 0);
  EXPECT_TRUE(std::isfinite(same));
  EXPECT_LT(std::abs(same), apart / 20); // the same distribution: near 0; shifted: far
  EXPECT_EQ(kernelInceptionDistance(x, y, 50, 100, 9), kernelInceptionDistance(x, y, 50, 100, 9));
  EXPECT_NE(kernelInceptionDistance(x, y, 50, 100, 9), kernelInceptionDistance(x, y, 50, 100, 10));
}
