// tests/unit/storage/test_png.cpp: checksums against published vectors, the rasteriser's
// pixels, and PNG bytes taken apart chunk by chunk and inflated (stored blocks) by hand.
#include <doctest/doctest.h>

#include <cstdint>
#include <string>

#include "storage/png.hpp"

using namespace crucible::storage;

namespace {

std::uint32_t be32(const std::string& s, std::size_t at) {
  return (std::uint32_t{static_cast<unsigned char>(s[at])} << 24) |
         (std::uint32_t{static_cast<unsigned char>(s[at + 1])} << 16) |
         (std::uint32_t{static_cast<unsigned char>(s[at + 2])} << 8) | std::uint32_t{static_cast<unsigned char>(s[at + 3])};
}

struct chunk {
  std::string type, data;
};

// Splits a PNG into chunks, checking the signature and every chunk's CRC.
std::vector<chunk> chunks_of(const std::string& png) {
  REQUIRE(png.size() >= 8);
  REQUIRE(png.substr(0, 8) == std::string("\x89PNG\r\n\x1a\n", 8));
  std::vector<chunk> out;
  std::size_t at = 8;
  while (at < png.size()) {
    REQUIRE(at + 12 <= png.size());
    auto len = be32(png, at);
    REQUIRE(at + 12 + len <= png.size());
    chunk c{png.substr(at + 4, 4), png.substr(at + 8, len)};
    CHECK(be32(png, at + 8 + len) == crc32(c.type + c.data));
    out.push_back(std::move(c));
    at += 12 + len;
  }
  return out;
}

// Inflates a zlib stream made only of stored blocks, checking header, LEN/NLEN and Adler-32.
std::string inflate_stored(const std::string& z) {
  REQUIRE(z.size() >= 6);
  CHECK(static_cast<unsigned char>(z[0]) == 0x78);
  CHECK(((static_cast<unsigned char>(z[0]) << 8) | static_cast<unsigned char>(z[1])) % 31 == 0);
  std::string out;
  std::size_t at = 2;
  for (bool last = false; !last;) {
    REQUIRE(at + 5 <= z.size());
    auto hdr = static_cast<unsigned char>(z[at]);
    CHECK((hdr & 0x06) == 0); // BTYPE 00: stored
    last = (hdr & 1) != 0;
    unsigned len = static_cast<unsigned char>(z[at + 1]) | (static_cast<unsigned char>(z[at + 2]) << 8);
    unsigned nlen = static_cast<unsigned char>(z[at + 3]) | (static_cast<unsigned char>(z[at + 4]) << 8);
    CHECK((len ^ nlen) == 0xFFFF);
    REQUIRE(at + 5 + len <= z.size());
    out.append(z, at + 5, len);
    at += 5 + len;
  }
  REQUIRE(at + 4 == z.size());
  CHECK(be32(z, at) == adler32(out));
  return out;
}

} // namespace

TEST_CASE("crc32 and adler32 match the published check values") {
  CHECK(crc32("123456789") == 0xCBF43926U);
  CHECK(crc32("") == 0U);
  CHECK(crc32("IEND") == 0xAE426082U); // the CRC every PNG ends with
  CHECK(crc32("56789", crc32("1234")) == 0xCBF43926U);
  CHECK(adler32("Wikipedia") == 0x11E60398U);
  CHECK(adler32("") == 1U);
  // Past the modulus and many table lookups: values from Python's zlib.adler32 / zlib.crc32.
  std::string big(1000000, '\xff');
  CHECK(adler32(big) == 0x3843E1BEU);
  CHECK(crc32(big) == 0x13FBDA0DU);
}

TEST_CASE("the rasteriser draws lines, rectangles and digits at the expected pixels") {
  const rgb white{255, 255, 255}, red{255, 0, 0}, blue{0, 0, 255};
  raster img{16, 12};
  CHECK(img.at(0, 0) == white);
  img.line(0, 0, 4, 4, red);
  for (int i = 0; i <= 4; ++i)
    CHECK(img.at(i, i) == red);
  CHECK(img.at(1, 0) == white);
  CHECK(img.at(5, 5) == white);
  img.line(10, 2, 6, 2, blue); // right to left, horizontal
  for (int x = 6; x <= 10; ++x)
    CHECK(img.at(x, 2) == blue);
  CHECK(img.at(5, 2) == white);
  CHECK(img.at(11, 2) == white);
  img.fill_rect(14, 11, 12, 9, blue); // corners in any order, clipped nowhere
  int filled = 0;
  for (int y = 0; y < 12; ++y)
    for (int x = 11; x < 16; ++x)
      filled += img.at(x, y) == blue ? 1 : 0;
  CHECK(filled == 9);
  img.fill_rect(-5, -5, 100, -1, red); // wholly outside: nothing
  img.set(16, 0, red);
  CHECK(img.at(15, 0) == white);

  raster t{12, 7};
  t.text(0, 0, "1-", red);
  // '1': rows 00100 01100 00100 00100 00100 00100 01110.
  CHECK(t.at(2, 0) == red);
  CHECK(t.at(1, 1) == red);
  CHECK(t.at(0, 0) == white);
  CHECK(t.at(1, 6) == red);
  CHECK(t.at(3, 6) == red);
  CHECK(t.at(4, 6) == white);
  // '-' starts 6 pixels on: row 3 full, row 2 empty.
  for (int x = 6; x <= 10; ++x) {
    CHECK(t.at(x, 3) == red);
    CHECK(t.at(x, 2) == white);
  }
  CHECK(raster::text_width("1-") == 11);
}

TEST_CASE("encode_png writes valid chunks whose stored deflate data are the pixels") {
  // 200 x 120 RGB: 72120 bytes of scanlines, so two stored blocks.
  raster img{200, 120, {10, 20, 30}};
  img.set(199, 119, {1, 2, 3});
  auto png = encode_png(img);
  auto chunks = chunks_of(png);
  REQUIRE(chunks.size() == 3);
  CHECK(chunks[0].type == "IHDR");
  CHECK(chunks[1].type == "IDAT");
  CHECK(chunks[2].type == "IEND");
  CHECK(chunks[2].data.empty());
  REQUIRE(chunks[0].data.size() == 13);
  CHECK(be32(chunks[0].data, 0) == 200);
  CHECK(be32(chunks[0].data, 4) == 120);
  CHECK(chunks[0].data.substr(8) == std::string("\x08\x02\x00\x00\x00", 5));
  auto raw = inflate_stored(chunks[1].data);
  REQUIRE(raw.size() == 120 * (1 + 200 * 3));
  for (int y = 0; y < 120; ++y) {
    auto row = static_cast<std::size_t>(y) * 601;
    CHECK(raw[row] == '\0');
    CHECK(raw.compare(row + 1, 600, reinterpret_cast<const char*>(img.pixels().data()) + y * 600, 600) == 0);
  }
  CHECK(raw.substr(raw.size() - 3) == std::string("\x01\x02\x03", 3));
  CHECK(static_cast<unsigned char>(chunks[1].data[2]) == 0); // first block is not the last
}
