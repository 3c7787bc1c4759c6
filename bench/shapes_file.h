// The gradient-shapes file (bench/resnet50_grad_shapes.txt): one tensor shape
// per line, dimensions joined by 'x' ("64x3x7x7"), '#' comments and blank
// lines ignored. Read by hora-bench, gpu-fusion-bench and the GPU tests.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace hora_bench {

struct TensorShape {
  std::vector<int64_t> dims;
  size_t count = 1;  // elements
  std::string text;  // as written in the file
};

// false with *error ("path:line: what") when the file cannot be read, a line
// is not a shape, or it holds no shape.
inline bool readShapeFile(const std::string& path, std::vector<TensorShape>* out,
                          std::string* error) {
  std::ifstream f(path);
  if (!f) {
    *error = "cannot read the gradient shapes file '" + path + "'";
    return false;
  }
  out->clear();
  std::string line;
  for (int lineNo = 1; std::getline(f, line); ++lineNo) {
    const auto b = line.find_first_not_of(" \t\r");
    if (b == std::string::npos || line[b] == '#') continue;
    const auto e = line.find_last_not_of(" \t\r");
    TensorShape s;
    s.text = line.substr(b, e - b + 1);
    std::stringstream ss(s.text);
    std::string d;
    while (std::getline(ss, d, 'x')) {
      char* end = nullptr;
      const long long v = std::strtoll(d.c_str(), &end, 10);
      if (d.empty() || *end != '\0' || v <= 0) {
        *error = path + ":" + std::to_string(lineNo) + ": bad shape '" + s.text +
                 "' (expected e.g. 64x3x7x7)";
        return false;
      }
      s.dims.push_back(v);
      s.count *= static_cast<size_t>(v);
    }
    out->push_back(std::move(s));
  }
  if (out->empty()) {
    *error = path + ": no shapes";
    return false;
  }
  return true;
}

}  // namespace hora_bench
