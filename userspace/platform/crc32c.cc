// CRC-32C (Castagnoli) for the seam: the SSE4.2 crc32 instruction when the CPU has
// it (checked once at first use), a slicing-by-8 table otherwise. Raw update
// semantics, like the kernel's crc32c(): no pre or post inversion here.
#include <cpuid.h>
#include <stdint.h>
#include <string.h>

#include "platform/platform.h"
#include "userspace/platform/crc32c.h"

namespace {

constexpr uint32_t kPoly = 0x82F63B78u;  // reflected Castagnoli polynomial

struct Tables {
  uint32_t t[8][256];
};

constexpr Tables MakeTables() {
  Tables tab{};
  for (uint32_t i = 0; i < 256; i++) {
    uint32_t c = i;
    for (int k = 0; k < 8; k++) c = (c & 1) ? (c >> 1) ^ kPoly : c >> 1;
    tab.t[0][i] = c;
  }
  for (uint32_t i = 0; i < 256; i++) {
    for (int s = 1; s < 8; s++) tab.t[s][i] = (tab.t[s - 1][i] >> 8) ^ tab.t[0][tab.t[s - 1][i] & 0xff];
  }
  return tab;
}

constexpr Tables kTables = MakeTables();

}  // namespace

namespace tfs::userspace {

uint32_t Crc32cSoftware(uint32_t crc, const void* data, size_t len) {
  auto* p = static_cast<const uint8_t*>(data);
  while (len > 0 && (reinterpret_cast<uintptr_t>(p) & 7) != 0) {
    crc = kTables.t[0][(crc ^ *p++) & 0xff] ^ (crc >> 8);
    len--;
  }
  while (len >= 8) {
    uint64_t w;
    memcpy(&w, p, 8);
    w ^= crc;
    crc = kTables.t[7][w & 0xff] ^ kTables.t[6][(w >> 8) & 0xff] ^ kTables.t[5][(w >> 16) & 0xff] ^
          kTables.t[4][(w >> 24) & 0xff] ^ kTables.t[3][(w >> 32) & 0xff] ^
          kTables.t[2][(w >> 40) & 0xff] ^ kTables.t[1][(w >> 48) & 0xff] ^
          kTables.t[0][(w >> 56) & 0xff];
    p += 8;
    len -= 8;
  }
  while (len-- > 0) crc = kTables.t[0][(crc ^ *p++) & 0xff] ^ (crc >> 8);
  return crc;
}

__attribute__((target("sse4.2"))) uint32_t Crc32cHardware(uint32_t crc, const void* data,
                                                           size_t len) {
  auto* p = static_cast<const uint8_t*>(data);
  uint64_t c = crc;
  while (len > 0 && (reinterpret_cast<uintptr_t>(p) & 7) != 0) {
    c = __builtin_ia32_crc32qi(uint32_t(c), *p++);
    len--;
  }
  while (len >= 8) {
    uint64_t w;
    memcpy(&w, p, 8);
    c = __builtin_ia32_crc32di(c, w);
    p += 8;
    len -= 8;
  }
  while (len-- > 0) c = __builtin_ia32_crc32qi(uint32_t(c), *p++);
  return uint32_t(c);
}

bool CpuHasSse42() {
  unsigned eax, ebx, ecx, edx;
  if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx)) return false;
  return (ecx & bit_SSE4_2) != 0;
}

}  // namespace tfs::userspace

extern "C" u32 tfs_plat_crc32c(u32 crc, const void* data, usize len) {
  static const bool hw = tfs::userspace::CpuHasSse42();
  return hw ? tfs::userspace::Crc32cHardware(crc, data, len)
            : tfs::userspace::Crc32cSoftware(crc, data, len);
}
