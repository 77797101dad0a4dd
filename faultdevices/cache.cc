// Volatile write cache and power cut (see cache.h). Sequence numbers are
// contiguous in records_ (only prefixes are retired), so a seq maps to its record
// by subtraction. The power-cut generator is a plain splitmix64 so that the outcome
// of a seed never depends on a standard library's distribution implementation.
#include "faultdevices/cache.h"

#include <cstdio>
#include <cstring>
#include <map>

namespace faultdev {
namespace {

uint64_t SplitMix(uint64_t* state) {
  uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

double Unit(uint64_t* state) { return double(SplitMix(state) >> 11) * (1.0 / 9007199254740992.0); }

// Turns sector -> data pointers into runs of consecutive sectors.
std::vector<SectorRun> ToRuns(const std::map<uint64_t, const uint8_t*>& sectors, uint32_t sector) {
  std::vector<SectorRun> runs;
  uint64_t prev = UINT64_MAX;
  for (const auto& [s, data] : sectors) {
    if (runs.empty() || s != prev + 1) runs.push_back(SectorRun{s * sector, {}});
    runs.back().data.insert(runs.back().data.end(), data, data + sector);
    prev = s;
  }
  return runs;
}

}  // namespace

uint64_t WriteCache::Add(uint64_t offset, const void* data, uint64_t length) {
  uint64_t seq = next_seq_++;
  const auto* p = static_cast<const uint8_t*>(data);
  records_.push_back(CacheRecord{seq, offset, std::vector<uint8_t>(p, p + length)});
  for (uint64_t s = offset / sector_; s < (offset + length) / sector_; s++) newest_[s] = seq;
  bytes_ += length;
  return seq;
}

const uint8_t* WriteCache::SectorData(uint64_t seq, uint64_t sector) const {
  const CacheRecord& r = records_[seq - records_.front().seq];
  return r.data.data() + (sector * sector_ - r.offset);
}

void WriteCache::PatchRead(uint64_t offset, uint64_t length, uint8_t* buf) const {
  if (newest_.empty()) return;
  for (uint64_t s = offset / sector_; s < (offset + length) / sector_; s++) {
    auto it = newest_.find(s);
    if (it != newest_.end()) memcpy(buf + (s * sector_ - offset), SectorData(it->second, s), sector_);
  }
}

std::vector<SectorRun> WriteCache::Patches(uint64_t offset, uint64_t length) const {
  std::map<uint64_t, const uint8_t*> sectors;
  if (!newest_.empty()) {
    for (uint64_t s = offset / sector_; s < (offset + length) / sector_; s++) {
      auto it = newest_.find(s);
      if (it != newest_.end()) sectors[s] = SectorData(it->second, s);
    }
  }
  return ToRuns(sectors, sector_);
}

std::vector<SectorRun> WriteCache::Plan(uint64_t upto) const {
  std::map<uint64_t, const uint8_t*> sectors;
  for (const CacheRecord& r : records_) {
    if (r.seq > upto) break;
    for (uint64_t i = 0; i < r.data.size() / sector_; i++) sectors[r.offset / sector_ + i] = r.data.data() + i * sector_;
  }
  return ToRuns(sectors, sector_);
}

void WriteCache::Retire(uint64_t upto) {
  while (!records_.empty() && records_.front().seq <= upto) {
    const CacheRecord& r = records_.front();
    for (uint64_t s = r.offset / sector_; s < (r.offset + r.data.size()) / sector_; s++) {
      auto it = newest_.find(s);
      if (it != newest_.end() && it->second == r.seq) newest_.erase(it);
    }
    bytes_ -= r.data.size();
    records_.pop_front();
  }
}

uint64_t WriteCache::SeqToShrinkTo(uint64_t target) const {
  uint64_t left = bytes_;
  uint64_t seq = records_.empty() ? 0 : records_.front().seq - 1;
  for (const CacheRecord& r : records_) {
    if (left <= target) break;
    left -= r.data.size();
    seq = r.seq;
  }
  return seq;
}

void WriteCache::Clear() {
  records_.clear();
  newest_.clear();
  bytes_ = 0;
}

std::deque<CacheRecord> WriteCache::TakeRecords() {
  std::deque<CacheRecord> out;
  out.swap(records_);
  Clear();
  return out;
}

CutOutcome PlanPowerCut(const std::deque<CacheRecord>& records, uint32_t sector, uint64_t seed,
                        const CutPolicy& policy) {
  CutOutcome out;
  uint64_t state = seed;
  std::map<uint64_t, const uint8_t*> sectors;
  for (const CacheRecord& r : records) {
    double u = Unit(&state);
    uint64_t n = r.data.size() / sector;
    if (u < policy.keep) {
      out.kept++;
      for (uint64_t i = 0; i < n; i++) sectors[r.offset / sector + i] = r.data.data() + i * sector;
    } else if (u < policy.keep + policy.drop) {
      out.dropped++;
    } else {
      out.torn++;
      for (uint64_t i = 0; i < n; i++) {
        if (SplitMix(&state) & 1) sectors[r.offset / sector + i] = r.data.data() + i * sector;
      }
    }
  }
  out.runs = ToRuns(sectors, sector);
  return out;
}

std::string RecordPath(const std::string& image) { return image + ".faultdev-cache"; }

namespace {

constexpr char kMagic[8] = {'T', 'F', 'S', 'F', 'D', 'C', '0', '1'};

bool Put(FILE* f, const void* p, size_t n) { return fwrite(p, 1, n, f) == n; }
bool Get(FILE* f, void* p, size_t n) { return fread(p, 1, n, f) == n; }

}  // namespace

bool SaveRecords(const std::string& path, uint32_t sector, const std::deque<CacheRecord>& records,
                 std::string* error) {
  static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "record files are little-endian");
  std::string tmp = path + ".tmp";
  FILE* f = fopen(tmp.c_str(), "wb");
  if (f == nullptr) {
    *error = tmp + ": cannot create: " + strerror(errno);
    return false;
  }
  uint32_t zero = 0;
  uint64_t count = records.size();
  bool ok = Put(f, kMagic, 8) && Put(f, &sector, 4) && Put(f, &zero, 4) && Put(f, &count, 8);
  for (const CacheRecord& r : records) {
    uint64_t len = r.data.size();
    ok = ok && Put(f, &r.seq, 8) && Put(f, &r.offset, 8) && Put(f, &len, 8) && Put(f, r.data.data(), len);
  }
  ok = (fclose(f) == 0) && ok;
  if (!ok || rename(tmp.c_str(), path.c_str()) != 0) {
    *error = path + ": cannot write: " + strerror(errno);
    remove(tmp.c_str());
    return false;
  }
  return true;
}

bool LoadRecords(const std::string& path, uint32_t* sector, std::deque<CacheRecord>* records,
                 std::string* error) {
  FILE* f = fopen(path.c_str(), "rb");
  if (f == nullptr) {
    *error = path + ": cannot open: " + strerror(errno);
    return false;
  }
  // Lengths in the file are checked against the bytes it actually holds before
  // anything is allocated: a short hostile file must not make us allocate gigabytes.
  uint64_t left = 0;
  if (fseeko(f, 0, SEEK_END) == 0) {
    off_t end = ftello(f);
    if (end > 0) left = uint64_t(end);
  }
  rewind(f);
  char magic[8];
  uint32_t zero = 0;
  uint64_t count = 0;
  constexpr uint64_t kHeader = 24, kRecordHeader = 24;
  bool ok = left >= kHeader && Get(f, magic, 8) && memcmp(magic, kMagic, 8) == 0 && Get(f, sector, 4) &&
            Get(f, &zero, 4) && Get(f, &count, 8) && *sector != 0 && (*sector & (*sector - 1)) == 0;
  if (ok) left -= kHeader;
  ok = ok && count <= left / kRecordHeader;
  for (uint64_t i = 0; ok && i < count; i++) {
    CacheRecord r;
    uint64_t len = 0;
    ok = left >= kRecordHeader && Get(f, &r.seq, 8) && Get(f, &r.offset, 8) && Get(f, &len, 8);
    if (ok) left -= kRecordHeader;
    ok = ok && len % *sector == 0 && r.offset % *sector == 0 && len <= left && r.offset <= UINT64_MAX - len;
    if (ok) {
      left -= len;
      r.data.resize(len);
      ok = Get(f, r.data.data(), len);
    }
    if (ok) records->push_back(std::move(r));
  }
  fclose(f);
  if (!ok) *error = path + ": not a faultdev cache record file (or truncated)";
  return ok;
}

}  // namespace faultdev
