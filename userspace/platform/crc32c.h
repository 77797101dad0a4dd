// The two CRC-32C implementations behind tfs_plat_crc32c, exposed so tests can
// check both against known vectors whatever CPU runs them. Raw update semantics (no
// inversion), like the seam function.
#ifndef TFS_USERSPACE_PLATFORM_CRC32C_H_
#define TFS_USERSPACE_PLATFORM_CRC32C_H_

#include <cstddef>
#include <cstdint>

namespace tfs::userspace {

uint32_t Crc32cSoftware(uint32_t crc, const void* data, size_t len);
// Requires CpuHasSse42().
uint32_t Crc32cHardware(uint32_t crc, const void* data, size_t len);
bool CpuHasSse42();

}  // namespace tfs::userspace

#endif  // TFS_USERSPACE_PLATFORM_CRC32C_H_
