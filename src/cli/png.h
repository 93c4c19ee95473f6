// An image grid as a PNG file (libpng), for `xloco sample` on image models.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace xloco::cli {

// Writes n images of channels x height x width bytes (channel-major, as a [n, C, H, W] tensor)
// as one PNG grid of `cols` columns with a 2-pixel border. C is 1 (grey) or 3 (RGB). Writes
// PATH.tmp and renames it; IoError naming the file on failure.
void write_png_grid(const std::string& path, const std::vector<uint8_t>& pixels, int64_t n,
                    int64_t channels, int64_t height, int64_t width, int64_t cols);

}  // namespace xloco::cli
