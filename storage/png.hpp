// storage/png.hpp: a small RGB rasteriser (lines, filled rectangles, a 5x7 bitmap font for
// numbers) and a PNG encoder with stored (uncompressed) deflate blocks; used by the report.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace crucible::storage {

/// CRC-32 (ISO 3309 / PNG, reflected polynomial 0xEDB88320) of `bytes`, continuing from `crc`
/// (pass the result of a previous call to checksum data in pieces).
std::uint32_t crc32(std::string_view bytes, std::uint32_t crc = 0);

/// Adler-32 (RFC 1950) of `bytes`.
std::uint32_t adler32(std::string_view bytes);

/// An 8-bit RGB colour.
struct rgb {
  std::uint8_t r = 0, g = 0, b = 0;
  friend bool operator==(const rgb&, const rgb&) = default;
};

/// A width x height RGB image, row-major, origin at the top left. Drawing clips to the image.
/// Value type; not thread-safe.
class raster final {
public:
  /// An image filled with `background`. Both sizes must be positive (asserted).
  raster(int width, int height, rgb background = {255, 255, 255});

  int width() const noexcept { return width_; }
  int height() const noexcept { return height_; }
  /// The pixel at (x, y); must lie inside (asserted).
  rgb at(int x, int y) const;
  /// Sets one pixel; outside the image it does nothing.
  void set(int x, int y, rgb c);
  /// A one-pixel line from (x0, y0) to (x1, y1), both ends included (Bresenham).
  void line(int x0, int y0, int x1, int y1, rgb c);
  /// Fills the rectangle with corners (x0, y0) and (x1, y1), both included, in any order.
  void fill_rect(int x0, int y0, int x1, int y1, rgb c);
  /// Draws `text` with its top-left corner at (x, y) in the 5x7 font, one column between
  /// glyphs (6 pixels per character). The font holds 0-9 . - + e x; other characters are blank.
  void text(int x, int y, std::string_view text, rgb c);
  /// Width in pixels of `text` as text() draws it.
  static int text_width(std::string_view text) noexcept;

  /// Rows of `width` RGB triples, top to bottom.
  const std::vector<std::uint8_t>& pixels() const noexcept { return px_; }

private:
  int width_, height_;
  std::vector<std::uint8_t> px_;
};

/// The PNG file of `image`: 8-bit RGB, no interlace, filter 0 on every row, the zlib stream
/// made of stored deflate blocks (no compression), CRC-32 and Adler-32 as the format asks.
std::string encode_png(const raster& image);

} // namespace crucible::storage
