// WriteCache: the data side of a volatile write cache, and the power cut.
//
// Like SQLite's crash VFS: writes are buffered (whole, in order, with a sequence
// number) until a flush; the backing image only ever holds durable data. Reads are
// patched with the newest cached sectors. Write-back always retires a *prefix* of
// the records (everything up to a sequence number), written as the newest data per
// sector within that prefix, so write-back can never put older data over newer
// durable data.
//
// A power cut decides, for each unflushed record in order, keep / drop / tear
// (tear: each sector independently kept or lost), from a seed, and produces the
// sector runs to write over the backing image. Decisions depend only on the seed
// and the record list, so the same seed over the same records gives the same image
// byte for byte.
//
// Records can be saved beside an image ("IMG.faultdev-cache") so that
// `faultdev powercut` can apply a cut to a recorded run later.
//
// Not thread-safe: the owner serialises calls.
#ifndef TFS_FAULTDEVICES_CACHE_H_
#define TFS_FAULTDEVICES_CACHE_H_

#include <cstdint>
#include <deque>
#include <string>
#include <unordered_map>
#include <vector>

namespace faultdev {

struct CacheRecord {
  uint64_t seq = 0;
  uint64_t offset = 0;
  std::vector<uint8_t> data;
};

// A piece of data to write at `offset` (a multiple of the sector size).
struct SectorRun {
  uint64_t offset = 0;
  std::vector<uint8_t> data;
};

struct CutOutcome {
  uint64_t kept = 0;
  uint64_t dropped = 0;
  uint64_t torn = 0;
  std::vector<SectorRun> runs;  // to write over the backing image, in any order
};

struct CutPolicy {
  double keep = 1.0 / 3, drop = 1.0 / 3, tear = 1.0 / 3;  // sum to 1
};

class WriteCache {
 public:
  explicit WriteCache(uint32_t sector) : sector_(sector) {}

  uint32_t sector() const { return sector_; }
  uint64_t bytes() const { return bytes_; }
  uint64_t last_seq() const { return next_seq_ - 1; }
  bool empty() const { return records_.empty(); }
  const std::deque<CacheRecord>& records() const { return records_; }

  // Buffers a write (offset and length multiples of the sector); returns its seq.
  uint64_t Add(uint64_t offset, const void* data, uint64_t length);
  // Copies the newest cached data of [offset, offset + length) into `buf` (which
  // already holds the backing image's contents of that range).
  void PatchRead(uint64_t offset, uint64_t length, uint8_t* buf) const;
  // Same, but returns the patches so they can be applied later.
  std::vector<SectorRun> Patches(uint64_t offset, uint64_t length) const;
  // The newest data per sector among records with seq <= upto, as runs.
  std::vector<SectorRun> Plan(uint64_t upto) const;
  // Records with seq <= upto are durable: forget them.
  void Retire(uint64_t upto);
  // The smallest seq such that retiring up to it leaves at most `target` bytes.
  uint64_t SeqToShrinkTo(uint64_t target) const;
  // Forgets everything (after a power cut).
  void Clear();
  // Hands over every record and forgets them.
  std::deque<CacheRecord> TakeRecords();

 private:
  const uint8_t* SectorData(uint64_t seq, uint64_t sector) const;

  uint32_t sector_;
  uint64_t next_seq_ = 1;
  uint64_t bytes_ = 0;
  std::deque<CacheRecord> records_;                 // contiguous seqs, oldest first
  std::unordered_map<uint64_t, uint64_t> newest_;   // sector index -> seq of newest record
};

// The power cut: fate of each record from `seed`.
CutOutcome PlanPowerCut(const std::deque<CacheRecord>& records, uint32_t sector, uint64_t seed,
                        const CutPolicy& policy);

// Record files: little-endian, "TFSFDC01", u32 sector, u32 0, u64 count, then per
// record u64 seq, u64 offset, u64 length, data. One-line errors in *error.
bool SaveRecords(const std::string& path, uint32_t sector, const std::deque<CacheRecord>& records,
                 std::string* error);
bool LoadRecords(const std::string& path, uint32_t* sector, std::deque<CacheRecord>* records,
                 std::string* error);
std::string RecordPath(const std::string& image);

}  // namespace faultdev

#endif  // TFS_FAULTDEVICES_CACHE_H_
