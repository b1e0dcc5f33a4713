#include "runtime/Commands.h"
#include <iostream>
namespace ganc::runtime {
int trainCommand(const std::vector<std::string> &) { std::cerr << "ganc: error: train is not built yet\n"; return 2; }
int runCommand(const std::string &, const std::vector<std::string> &) { std::cerr << "ganc: error: run is not built yet\n"; return 2; }
}
