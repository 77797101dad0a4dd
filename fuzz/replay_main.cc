// Runs every input named on the command line (files, or directories of files)
// through the target once: the corpus replay of builds without libFuzzer.
#include <dirent.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "fuzz/fuzz.h"

namespace {

bool RunFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    fprintf(stderr, "fuzz replay: cannot read %s\n", path.c_str());
    return false;
  }
  std::vector<uint8_t> data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  LLVMFuzzerTestOneInput(data.data(), data.size());
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s FILE_OR_DIR...\n", argv[0]);
    return 2;
  }
  size_t n = 0;
  for (int i = 1; i < argc; i++) {
    struct stat st;
    if (stat(argv[i], &st) != 0) {
      fprintf(stderr, "fuzz replay: %s: no such file or directory\n", argv[i]);
      return 2;
    }
    std::vector<std::string> files;
    if (S_ISDIR(st.st_mode)) {
      DIR* d = opendir(argv[i]);
      if (d == nullptr) return 2;
      while (dirent* e = readdir(d)) {
        if (e->d_name[0] != '.') files.push_back(std::string(argv[i]) + "/" + e->d_name);
      }
      closedir(d);
      std::sort(files.begin(), files.end());
    } else {
      files.push_back(argv[i]);
    }
    for (const std::string& f : files) {
      if (!RunFile(f)) return 2;
      n++;
    }
  }
  if (n == 0) {
    fprintf(stderr, "fuzz replay: no inputs\n");
    return 2;
  }
  printf("fuzz replay: %zu inputs, no finding\n", n);
  return 0;
}
