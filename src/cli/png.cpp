#include "cli/png.h"

#include <cstdio>
#include <filesystem>

#include <png.h>

#include "common/error.h"

namespace xloco::cli {

void write_png_grid(const std::string& path, const std::vector<uint8_t>& pixels, int64_t n,
                    int64_t channels, int64_t height, int64_t width, int64_t cols) {
  XLOCO_ENFORCE(channels == 1 || channels == 3, common::Error,
                "an image grid needs 1 or 3 channels, got {}", channels);
  XLOCO_ENFORCE(n > 0 && cols > 0 && static_cast<int64_t>(pixels.size()) == n * channels * height * width,
                common::Error, "image grid: {} bytes for {} images of {}x{}x{}", pixels.size(), n,
                channels, height, width);
  constexpr int64_t kPad = 2;
  const int64_t rows = (n + cols - 1) / cols;
  const int64_t gw = cols * (width + kPad) + kPad, gh = rows * (height + kPad) + kPad;
  std::vector<uint8_t> grid(static_cast<size_t>(gw * gh * channels), 0);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t x0 = kPad + (i % cols) * (width + kPad), y0 = kPad + (i / cols) * (height + kPad);
    for (int64_t c = 0; c < channels; ++c) {
      for (int64_t y = 0; y < height; ++y) {
        for (int64_t x = 0; x < width; ++x) {
          grid[((y0 + y) * gw + x0 + x) * channels + c] =
              pixels[((i * channels + c) * height + y) * width + x];
        }
      }
    }
  }
  const std::string tmp = path + ".tmp";
  FILE* f = std::fopen(tmp.c_str(), "wb");
  XLOCO_ENFORCE(f != nullptr, common::IoError, "cannot write {}", tmp);
  png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, nullptr, nullptr, nullptr);
  png_infop info = png ? png_create_info_struct(png) : nullptr;
  if (!png || !info || setjmp(png_jmpbuf(png))) {
    png_destroy_write_struct(&png, &info);
    std::fclose(f);
    std::remove(tmp.c_str());
    throw common::IoError(fmt::format("libpng failed writing {}", tmp));
  }
  png_init_io(png, f);
  png_set_IHDR(png, info, static_cast<png_uint_32>(gw), static_cast<png_uint_32>(gh), 8,
               channels == 1 ? PNG_COLOR_TYPE_GRAY : PNG_COLOR_TYPE_RGB, PNG_INTERLACE_NONE,
               PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
  png_write_info(png, info);
  for (int64_t y = 0; y < gh; ++y) {
    png_write_row(png, grid.data() + y * gw * channels);
  }
  png_write_end(png, nullptr);
  png_destroy_write_struct(&png, &info);
  const bool ok = std::fflush(f) == 0 && std::ferror(f) == 0;
  std::fclose(f);
  if (!ok) {
    std::remove(tmp.c_str());
    throw common::IoError(fmt::format("cannot write {} (disk full?)", tmp));
  }
  std::filesystem::rename(tmp, path);
}

}  // namespace xloco::cli
