// The Fréchet Inception Distance and the Kernel Inception Distance of two sets of features,
// as StyleGAN2-ADA and StyleGAN3 define them (metrics/frechet_inception_distance.py and
// metrics/kernel_inception_distance.py), computed in float64.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>

namespace ganc::runtime {

/// The mean and covariance of a set of features, as StyleGAN's FeatureStats keeps them:
/// float64 raw moments, covariance E[x x^T] - mu mu^T (over N, not N - 1).
struct FeatureMoments {
  at::Tensor mean;       // [F], float64
  at::Tensor covariance; // [F, F], float64
  int64_t count = 0;
};

/// The moments of `features` ([N, F], any floating dtype), computed on their device.
FeatureMoments featureMoments(const at::Tensor &features);

/// FID = |mu_a - mu_b|^2 + tr(S_a + S_b - 2 (S_a S_b)^(1/2)). SciPy's sqrtm takes the square
/// root of the non-symmetric product S_a S_b; its trace is the sum of the square roots of that
/// product's eigenvalues, which are those of the symmetric S_a^(1/2) S_b S_a^(1/2): found here
/// with two symmetric eigendecompositions (eigenvalues below zero, from rounding, count as 0).
double frechetDistance(const FeatureMoments &a, const FeatureMoments &b);

/// KID: the unbiased MMD^2 with the polynomial kernel k(x, y) = (x.y / F + 1)^3, averaged over
/// `subsets` random subsets of m = min(N_generated, N_real, maxSubsetSize) features of each set
/// (StyleGAN's 100 subsets of at most 1000). Subsets are drawn without replacement from a
/// generator seeded with `seed` (not NumPy's stream: with larger sets the value differs from
/// StyleGAN's by the subsets' sampling error); where m is the size of both sets every subset is
/// the whole of both and gives the same value, computed once.
double kernelInceptionDistance(const at::Tensor &generated, const at::Tensor &real,
                               int64_t subsets = 100, int64_t maxSubsetSize = 1000,
                               uint64_t seed = 0);

} // namespace ganc::runtime
