// storage/png.cpp: pixels in, PNG bytes out. No compression: the report's plots are small,
// and stored blocks keep the encoder short enough to check by eye.
#include "storage/png.hpp"

#include <algorithm>
#include <array>
#include <cassert>
#include <cstdlib>

namespace crucible::storage {

namespace {

const std::array<std::uint32_t, 256>& crc_table() {
  static const auto table = [] {
    std::array<std::uint32_t, 256> t{};
    for (std::uint32_t n = 0; n < 256; ++n) {
      std::uint32_t c = n;
      for (int k = 0; k < 8; ++k)
        c = (c & 1U) ? 0xEDB88320U ^ (c >> 1) : c >> 1;
      t[n] = c;
    }
    return t;
  }();
  return table;
}

// Rows of the 5x7 glyphs, bit 4 the leftmost column.
struct glyph {
  char ch;
  std::array<std::uint8_t, 7> rows;
};

constexpr std::array<glyph, 15> font = {{
  {'0', {0x0E, 0x11, 0x13, 0x15, 0x19, 0x11, 0x0E}},
  {'1', {0x04, 0x0C, 0x04, 0x04, 0x04, 0x04, 0x0E}},
  {'2', {0x0E, 0x11, 0x01, 0x02, 0x04, 0x08, 0x1F}},
  {'3', {0x1F, 0x02, 0x04, 0x02, 0x01, 0x11, 0x0E}},
  {'4', {0x02, 0x06, 0x0A, 0x12, 0x1F, 0x02, 0x02}},
  {'5', {0x1F, 0x10, 0x1E, 0x01, 0x01, 0x11, 0x0E}},
  {'6', {0x06, 0x08, 0x10, 0x1E, 0x11, 0x11, 0x0E}},
  {'7', {0x1F, 0x01, 0x02, 0x04, 0x08, 0x08, 0x08}},
  {'8', {0x0E, 0x11, 0x11, 0x0E, 0x11, 0x11, 0x0E}},
  {'9', {0x0E, 0x11, 0x11, 0x0F, 0x01, 0x02, 0x0C}},
  {'.', {0x00, 0x00, 0x00, 0x00, 0x00, 0x0C, 0x0C}},
  {'-', {0x00, 0x00, 0x00, 0x1F, 0x00, 0x00, 0x00}},
  {'+', {0x00, 0x04, 0x04, 0x1F, 0x04, 0x04, 0x00}},
  {'e', {0x00, 0x00, 0x0E, 0x11, 0x1F, 0x10, 0x0E}},
  {'x', {0x00, 0x00, 0x11, 0x0A, 0x04, 0x0A, 0x11}},
}};

void put_u32(std::string& out, std::uint32_t v) {
  out.push_back(static_cast<char>(v >> 24));
  out.push_back(static_cast<char>(v >> 16));
  out.push_back(static_cast<char>(v >> 8));
  out.push_back(static_cast<char>(v));
}

void put_chunk(std::string& out, std::string_view type, std::string_view data) {
  assert(type.size() == 4);
  put_u32(out, static_cast<std::uint32_t>(data.size()));
  std::string body{type};
  body.append(data);
  out.append(body);
  put_u32(out, crc32(body));
}

} // namespace

std::uint32_t crc32(std::string_view bytes, std::uint32_t crc) {
  const auto& t = crc_table();
  crc = ~crc;
  for (unsigned char b : bytes)
    crc = t[(crc ^ b) & 0xFFU] ^ (crc >> 8);
  return ~crc;
}

std::uint32_t adler32(std::string_view bytes) {
  constexpr std::uint32_t mod = 65521;
  std::uint32_t a = 1, b = 0;
  for (unsigned char c : bytes) {
    a = (a + c) % mod;
    b = (b + a) % mod;
  }
  return (b << 16) | a;
}

raster::raster(int width, int height, rgb background) : width_(width), height_(height) {
  assert(width > 0 && height > 0);
  px_.resize(static_cast<std::size_t>(width) * static_cast<std::size_t>(height) * 3);
  for (std::size_t i = 0; i < px_.size(); i += 3) {
    px_[i] = background.r;
    px_[i + 1] = background.g;
    px_[i + 2] = background.b;
  }
}

rgb raster::at(int x, int y) const {
  assert(x >= 0 && x < width_ && y >= 0 && y < height_);
  auto i = (static_cast<std::size_t>(y) * static_cast<std::size_t>(width_) + static_cast<std::size_t>(x)) * 3;
  return {px_[i], px_[i + 1], px_[i + 2]};
}

void raster::set(int x, int y, rgb c) {
  if (x < 0 || x >= width_ || y < 0 || y >= height_)
    return;
  auto i = (static_cast<std::size_t>(y) * static_cast<std::size_t>(width_) + static_cast<std::size_t>(x)) * 3;
  px_[i] = c.r;
  px_[i + 1] = c.g;
  px_[i + 2] = c.b;
}

void raster::line(int x0, int y0, int x1, int y1, rgb c) {
  int dx = std::abs(x1 - x0), sx = x0 < x1 ? 1 : -1;
  int dy = -std::abs(y1 - y0), sy = y0 < y1 ? 1 : -1;
  int err = dx + dy;
  for (;;) {
    set(x0, y0, c);
    if (x0 == x1 && y0 == y1)
      break;
    int e2 = 2 * err;
    if (e2 >= dy) {
      err += dy;
      x0 += sx;
    }
    if (e2 <= dx) {
      err += dx;
      y0 += sy;
    }
  }
}

void raster::fill_rect(int x0, int y0, int x1, int y1, rgb c) {
  if (x0 > x1)
    std::swap(x0, x1);
  if (y0 > y1)
    std::swap(y0, y1);
  x0 = std::max(x0, 0);
  y0 = std::max(y0, 0);
  x1 = std::min(x1, width_ - 1);
  y1 = std::min(y1, height_ - 1);
  for (int y = y0; y <= y1; ++y)
    for (int x = x0; x <= x1; ++x)
      set(x, y, c);
}

void raster::text(int x, int y, std::string_view s, rgb c) {
  for (char ch : s) {
    auto g = std::find_if(font.begin(), font.end(), [ch](const glyph& gl) { return gl.ch == ch; });
    if (g != font.end())
      for (int row = 0; row < 7; ++row)
        for (int col = 0; col < 5; ++col)
          if (g->rows[static_cast<std::size_t>(row)] & (0x10U >> col))
            set(x + col, y + row, c);
    x += 6;
  }
}

int raster::text_width(std::string_view s) noexcept {
  return s.empty() ? 0 : static_cast<int>(s.size()) * 6 - 1;
}

std::string encode_png(const raster& image) {
  // Filtered scanlines: a 0 (filter "None") before each row.
  std::string raw;
  const auto row_bytes = static_cast<std::size_t>(image.width()) * 3;
  raw.reserve((row_bytes + 1) * static_cast<std::size_t>(image.height()));
  const auto* px = reinterpret_cast<const char*>(image.pixels().data());
  for (int y = 0; y < image.height(); ++y) {
    raw.push_back('\0');
    raw.append(px + static_cast<std::size_t>(y) * row_bytes, row_bytes);
  }
  // zlib: CMF 0x78 (deflate, 32K window), FLG 0x01 (fastest; 0x7801 % 31 == 0), then stored
  // blocks of at most 65535 bytes: a header byte (BFINAL, BTYPE 00), LEN and ~LEN little-endian.
  std::string z{"\x78\x01", 2};
  std::size_t pos = 0;
  do {
    auto n = std::min<std::size_t>(65535, raw.size() - pos);
    bool last = pos + n == raw.size();
    z.push_back(last ? '\x01' : '\x00');
    auto len = static_cast<std::uint16_t>(n);
    auto nlen = static_cast<std::uint16_t>(~len);
    z.push_back(static_cast<char>(len & 0xFF));
    z.push_back(static_cast<char>(len >> 8));
    z.push_back(static_cast<char>(nlen & 0xFF));
    z.push_back(static_cast<char>(nlen >> 8));
    z.append(raw, pos, n);
    pos += n;
  } while (pos < raw.size());
  put_u32(z, adler32(raw));

  std::string out{"\x89PNG\r\n\x1a\n", 8};
  std::string ihdr;
  put_u32(ihdr, static_cast<std::uint32_t>(image.width()));
  put_u32(ihdr, static_cast<std::uint32_t>(image.height()));
  ihdr.append(std::string{"\x08\x02\x00\x00\x00", 5}); // depth 8, RGB, deflate, filter 0, no interlace
  put_chunk(out, "IHDR", ihdr);
  put_chunk(out, "IDAT", z);
  put_chunk(out, "IEND", {});
  return out;
}

} // namespace crucible::storage
