// PNG grids of samples (stb_image_write from Debian's libstb).
#include "runtime/data/Image.h"

#include <cmath>
#include <cstdio>

#define STB_IMAGE_WRITE_IMPLEMENTATION
#include <stb/stb_image_write.h>

namespace ganc::runtime {

namespace {

/// 2-D points: a 256x256 scatter plot of the square [-2, 2]^2 (the ring data lives inside).
at::Tensor scatter(const at::Tensor &points) {
  const int size = 256;
  at::Tensor canvas = torch::full({size, size, 3}, 255, torch::kUInt8);
  auto p = points.to(torch::kFloat32).contiguous();
  auto acc = canvas.accessor<uint8_t, 3>();
  for (int64_t i = 0; i < p.size(0); ++i) {
    float x = p[i][0].item<float>(), y = p[i][1].item<float>();
    int cx = static_cast<int>((x + 2.f) / 4.f * size),
        cy = static_cast<int>((2.f - y) / 4.f * size);
    for (int dy = -1; dy <= 1; ++dy)
      for (int dx = -1; dx <= 1; ++dx) {
        int px = cx + dx, py = cy + dy;
        if (px >= 0 && px < size && py >= 0 && py < size) {
          acc[py][px][0] = 20;
          acc[py][px][1] = 60;
          acc[py][px][2] = 200;
        }
      }
  }
  return canvas;
}

at::Tensor grid(const at::Tensor &samples, int64_t columns) {
  const int64_t n = samples.size(0), c = samples.size(1), h = samples.size(2), w = samples.size(3);
  const int64_t cols =
      columns > 0 ? columns : static_cast<int64_t>(std::ceil(std::sqrt(static_cast<double>(n))));
  const int64_t rows = (n + cols - 1) / cols, pad = 2;
  at::Tensor canvas = torch::zeros({3, rows * (h + pad) + pad, cols * (w + pad) + pad});
  at::Tensor images = ((samples.to(torch::kFloat32).clamp(-1, 1) + 1) * 127.5);
  if (c == 1)
    images = images.expand({n, 3, h, w});
  for (int64_t i = 0; i < n; ++i) {
    int64_t r = i / cols, col = i % cols;
    canvas.narrow(1, pad + r * (h + pad), h).narrow(2, pad + col * (w + pad), w).copy_(images[i]);
  }
  return canvas.round().to(torch::kUInt8).permute({1, 2, 0}).contiguous();
}

} // namespace

Status writeSampleGrid(const at::Tensor &samples, const std::string &path, int64_t columns) {
  at::Tensor s = samples.detach().cpu();
  at::Tensor image;
  if (s.dim() == 2 && s.size(1) == 2)
    image = scatter(s);
  else if (s.dim() == 4 && (s.size(1) == 1 || s.size(1) == 3))
    image = grid(s, columns);
  else
    return Status::error("samples of shape " + c10::str(s.sizes()) +
                         " are neither images nor 2-D points");
  std::string tmp = path + ".tmp";
  if (!stbi_write_png(tmp.c_str(), static_cast<int>(image.size(1)), static_cast<int>(image.size(0)),
                      3, image.data_ptr<uint8_t>(), static_cast<int>(image.size(1) * 3)))
    return Status::error("cannot write " + tmp);
  if (std::rename(tmp.c_str(), path.c_str()) != 0)
    return Status::error("cannot rename " + tmp + " to " + path);
  return Status::ok();
}

} // namespace ganc::runtime
