// FID and KID from features.
#include "runtime/metrics/MetricMath.h"

#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>

namespace ganc::runtime {

FeatureMoments featureMoments(const at::Tensor &features) {
  // On the features' device (a GPU's float64 matmul where they are there), kept on the CPU.
  const at::Tensor x = features.detach().to(at::kDouble);
  const int64_t n = x.size(0);
  FeatureMoments m;
  m.count = n;
  const at::Tensor mean = x.sum(0) / static_cast<double>(n);
  m.mean = mean.cpu();
  m.covariance = (x.t().matmul(x) / static_cast<double>(n) - at::outer(mean, mean)).cpu();
  return m;
}

double frechetDistance(const FeatureMoments &a, const FeatureMoments &b) {
  const double meanTerm = (a.mean - b.mean).square().sum().item<double>();
  // S_a^(1/2) from S_a = V diag(l) V^T; then the eigenvalues of S_a^(1/2) S_b S_a^(1/2).
  auto [values, vectors] = at::linalg_eigh(a.covariance);
  const at::Tensor root = (vectors * values.clamp_min(0).sqrt()).matmul(vectors.t());
  at::Tensor product = root.matmul(b.covariance).matmul(root);
  product = (product + product.t()) / 2; // symmetric to the last bit, for eigvalsh
  const double rootTrace = at::linalg_eigvalsh(product).clamp_min(0).sqrt().sum().item<double>();
  return meanTerm + a.covariance.trace().item<double>() + b.covariance.trace().item<double>() -
         2 * rootTrace;
}

double kernelInceptionDistance(const at::Tensor &generated, const at::Tensor &real, int64_t subsets,
                               int64_t maxSubsetSize, uint64_t seed) {
  const at::Tensor gen = generated.detach().to(at::kDouble);
  const at::Tensor ref = real.detach().to(generated.device(), at::kDouble);
  const double n = static_cast<double>(gen.size(1));
  const int64_t m = std::min({gen.size(0), ref.size(0), maxSubsetSize});
  auto random = at::detail::createCPUGenerator(seed);
  auto pick = [&](const at::Tensor &set) {
    const at::Tensor rows = at::randperm(set.size(0), random, at::kLong).narrow(0, 0, m);
    return set.index_select(0, rows.to(set.device()));
  };
  // Where a subset is the whole of both sets every subset gives the same value (the sums run
  // over all pairs): it is computed once.
  if (m == gen.size(0) && m == ref.size(0))
    subsets = 1;
  double t = 0;
  for (int64_t i = 0; i < subsets; ++i) {
    const at::Tensor x = pick(gen), y = pick(ref);
    const at::Tensor a = (x.matmul(x.t()) / n + 1).pow(3) + (y.matmul(y.t()) / n + 1).pow(3);
    const at::Tensor b = (x.matmul(y.t()) / n + 1).pow(3);
    t += (a.sum().item<double>() - a.diagonal().sum().item<double>()) / static_cast<double>(m - 1) -
         b.sum().item<double>() * 2 / static_cast<double>(m);
  }
  return t / static_cast<double>(subsets) / static_cast<double>(m);
}

} // namespace ganc::runtime
