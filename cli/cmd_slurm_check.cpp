// SPDX-License-Identifier: Apache-2.0
// solar slurm-check: whether this host's Slurm will load solar's SPANK plugin, checked as an
// admin would after installing it: the plugstack line, the plugin's Slurm release (read from
// the file, not loaded) against the host's, and what `srun --help` really shows. A plugin of
// another major.minor release is refused by Slurm, and under an `optional` line jobs then run
// without solar, only a line on srun's stderr saying so (spank/README.md, solar_spank(8)).
#include <elf.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <glob.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "commands.h"
#include "solar/sys/subprocess.h"

namespace solar::cli {
namespace {

namespace fs = std::filesystem;

struct PlugstackLine {
  std::string where;  // FILE:LINE
  std::string kind;   // optional | required
  std::string path;
};

std::string trim(std::string s) {
  const auto b = s.find_first_not_of(" \t\r");
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(" \t\r") - b + 1);
}

// Slurm's plugstack.conf grammar as far as it matters here: `optional|required PATH args...`
// and `include GLOB` (relative to the including file's folder), # comments.
void read_plugstack(const fs::path& file, int depth, std::vector<PlugstackLine>& found,
                    std::vector<std::string>& read, std::vector<std::string>& problems) {
  std::ifstream in(file);
  if (!in) {
    problems.push_back(fmt::format("{}: cannot read ({})", file.string(), std::strerror(errno)));
    return;
  }
  read.push_back(file.string());
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    line = trim(line.substr(0, line.find('#')));
    if (line.empty()) continue;
    std::istringstream words(line);
    std::string kind, path;
    words >> kind >> path;
    if (kind == "include" && depth < 8) {
      fs::path pattern = path;
      if (pattern.is_relative()) pattern = file.parent_path() / pattern;
      glob_t g{};
      if (::glob(pattern.c_str(), 0, nullptr, &g) == 0)
        for (std::size_t i = 0; i < g.gl_pathc; ++i)
          read_plugstack(g.gl_pathv[i], depth + 1, found, read, problems);
      ::globfree(&g);
    } else if ((kind == "optional" || kind == "required") &&
               fs::path(path).filename() == "solar_spank.so") {
      found.push_back({fmt::format("{}:{}", file.string(), n), kind, path});
    }
  }
}

// The plugin's `plugin_version` (Slurm's SLURM_VERSION_NUMBER, 0xMMmmuu) read from its ELF
// symbol table, without loading it (a plugin of another release may not even link here).
std::optional<std::uint32_t> plugin_version_of(const std::string& path, std::string& why) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    why = std::strerror(errno);
    return std::nullopt;
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0 || st.st_size < static_cast<off_t>(sizeof(Elf64_Ehdr))) {
    ::close(fd);
    why = "not an ELF file";
    return std::nullopt;
  }
  const std::size_t size = static_cast<std::size_t>(st.st_size);
  void* map = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (map == MAP_FAILED) {
    why = std::strerror(errno);
    return std::nullopt;
  }
  const auto* base = static_cast<const unsigned char*>(map);
  std::optional<std::uint32_t> version;
  why = "no plugin_version symbol: not a Slurm plugin";
  const auto* eh = reinterpret_cast<const Elf64_Ehdr*>(base);
  auto inside = [&](std::uint64_t off, std::uint64_t len) { return off <= size && len <= size - off; };
  if (std::memcmp(eh->e_ident, ELFMAG, SELFMAG) != 0 || eh->e_ident[EI_CLASS] != ELFCLASS64 ||
      !inside(eh->e_shoff, std::uint64_t{eh->e_shnum} * sizeof(Elf64_Shdr))) {
    why = "not a 64-bit ELF file";
  } else {
    const auto* sh = reinterpret_cast<const Elf64_Shdr*>(base + eh->e_shoff);
    for (unsigned i = 0; i < eh->e_shnum && !version; ++i) {
      if (sh[i].sh_type != SHT_DYNSYM && sh[i].sh_type != SHT_SYMTAB) continue;
      if (sh[i].sh_link >= eh->e_shnum || !inside(sh[i].sh_offset, sh[i].sh_size)) continue;
      const Elf64_Shdr& strtab = sh[sh[i].sh_link];
      if (!inside(strtab.sh_offset, strtab.sh_size)) continue;
      const auto* syms = reinterpret_cast<const Elf64_Sym*>(base + sh[i].sh_offset);
      for (std::size_t k = 0; k < sh[i].sh_size / sizeof(Elf64_Sym); ++k) {
        if (syms[k].st_name >= strtab.sh_size || syms[k].st_shndx == SHN_UNDEF ||
            syms[k].st_shndx >= eh->e_shnum || syms[k].st_size != 4)
          continue;
        const char* name = reinterpret_cast<const char*>(base + strtab.sh_offset + syms[k].st_name);
        if (std::strncmp(name, "plugin_version", strtab.sh_size - syms[k].st_name) != 0) continue;
        const Elf64_Shdr& data = sh[syms[k].st_shndx];
        const std::uint64_t off = data.sh_offset + (syms[k].st_value - data.sh_addr);
        if (data.sh_type == SHT_NOBITS || syms[k].st_value < data.sh_addr || !inside(off, 4)) {
          why = "plugin_version lies outside the file";
          break;
        }
        std::uint32_t v;
        std::memcpy(&v, base + off, 4);
        version = v;
        break;
      }
    }
  }
  ::munmap(map, size);
  return version;
}

std::string release_text(std::uint32_t v) {
  return fmt::format("{}.{:02}.{}", v >> 16, (v >> 8) & 0xff, v & 0xff);
}

std::string last_line(const std::string& text) {
  std::string last;
  std::istringstream in(text);
  for (std::string l; std::getline(in, l);)
    if (!trim(l).empty()) last = trim(l);
  return last.empty() ? "no output" : last;
}

std::string find_on_path(const std::string& name) {
  if (name.find('/') != std::string::npos) return name;
  const char* path = std::getenv("PATH");
  std::istringstream dirs(path ? path : "/usr/bin:/bin");
  for (std::string dir; std::getline(dirs, dir, ':');) {
    const fs::path p = fs::path(dir.empty() ? "." : dir) / name;
    if (::access(p.c_str(), X_OK) == 0) return p.string();
  }
  return "";
}

// "slurm 22.05.8" -> 0x160508
std::optional<std::uint32_t> parse_slurm_version(const std::string& text) {
  unsigned major = 0, minor = 0, micro = 0;
  const auto at = text.find_first_of("0123456789");
  if (at == std::string::npos ||
      std::sscanf(text.c_str() + at, "%u.%u.%u", &major, &minor, &micro) < 2)
    return std::nullopt;
  return (major << 16) | (minor << 8) | micro;
}

int slurm_check(std::string plugstack, const std::string& srun_name, bool quiet_ok) {
  int problems = 0;
  auto ok = [&](const std::string& text) {
    if (!quiet_ok) std::printf("ok       %s\n", text.c_str());
  };
  auto bad = [&](const std::string& text) {
    std::printf("PROBLEM  %s\n", text.c_str());
    ++problems;
  };

  // 1. The plugstack line (PlugStackConfig defaults to plugstack.conf beside slurm.conf).
  if (plugstack.empty()) {
    const char* conf = std::getenv("SLURM_CONF");
    plugstack = (fs::path(conf && *conf ? conf : "/etc/slurm/slurm.conf").parent_path() /
                 "plugstack.conf").string();
  }
  std::vector<PlugstackLine> lines;
  std::vector<std::string> read, unreadable;
  read_plugstack(plugstack, 0, lines, read, unreadable);
  for (const auto& u : unreadable) bad(u);
  if (lines.empty() && unreadable.empty())
    bad(fmt::format("no active solar_spank.so line in {} or what it includes ({} file{}): "
                    "uncomment the line of /etc/slurm/plugstack.conf.d/solar.conf (Debian's "
                    "plugstack.conf includes that folder), or add `optional "
                    "PATH/solar_spank.so plan_dir=...` (man 8 solar_spank)",
                    plugstack, read.size(), read.size() == 1 ? "" : "s"));
  if (lines.size() > 1) bad(fmt::format("{} solar_spank.so lines ({} and {}): keep one",
                                        lines.size(), lines[0].where, lines[1].where));

  // 2. The host's Slurm.
  const std::string srun = find_on_path(srun_name);
  std::optional<std::uint32_t> host;
  if (srun.empty()) {
    bad(fmt::format("{}: not found on PATH: is Slurm's client (slurm-client) installed?",
                    srun_name));
  } else {
    std::string out, err;
    const int st = sys::run_captured({srun, "--version"}, 30, out, err);
    host = st == 0 ? parse_slurm_version(out) : std::nullopt;
    if (!host)
      bad(fmt::format("{} --version failed: {} (this host's Slurm configuration: $SLURM_CONF "
                      "or /etc/slurm/slurm.conf)",
                      srun, last_line(st == 0 ? out : err)));
    else
      ok(fmt::format("Slurm {} ({} --version)", release_text(*host), srun));
  }

  // 3. Each line's plugin: there, and of the host's major.minor release.
  for (const auto& line : lines) {
    std::string why;
    const auto v = plugin_version_of(line.path, why);
    if (!v) {
      bad(fmt::format("{}: {} {}: {}{}", line.where, line.kind, line.path, why,
                      line.kind == "optional" ? " (srun skips it: jobs run without solar)"
                                              : " (every job fails until it is fixed)"));
      continue;
    }
    if (host && (*v >> 8) != (*host >> 8)) {
      bad(fmt::format("{}: {} was built for Slurm {}, this host runs {}: Slurm loads a plugin "
                      "only of its own major.minor release, so {}. Install the "
                      "solar-slurm-plugin built for Slurm {}.{:02} (or rebuild solar against "
                      "this Slurm's libslurm-dev)",
                      line.where, line.path, release_text(*v), release_text(*host),
                      line.kind == "optional" ? "srun skips it and jobs run without solar"
                                              : "every job fails",
                      *host >> 16, (*host >> 8) & 0xff));
      continue;
    }
    ok(fmt::format("{}: {} {} (built for Slurm {})", line.where, line.kind, line.path,
                   release_text(*v)));
  }

  // 4. What srun itself makes of it: the --solar-* options in its --help.
  if (!srun.empty() && !lines.empty()) {
    std::string out, err;
    const int st = sys::run_captured({srun, "--help"}, 30, out, err);
    if (out.find("--solar-dataset") != std::string::npos) {
      ok("srun --help lists the --solar-* options: the plugin loads");
    } else {
      std::string said;
      std::istringstream e(err);
      for (std::string l; std::getline(e, l);)
        if (l.find("spank") != std::string::npos || l.find("plugin") != std::string::npos)
          said += "\n         " + l;
      bad(fmt::format("srun --help (exit {}) shows no --solar-* option{}", sys::exit_code_of(st),
                      said.empty() ? "" : ": srun said" + said));
    }
  }

  if (problems == 0)
    std::printf("solar slurm-check: the plugin is in effect\n");
  else
    std::printf("solar slurm-check: %d problem%s: srun steps run without solar until fixed\n",
                problems, problems == 1 ? "" : "s");
  return problems == 0 ? kExitOk : kExitFailure;
}

}  // namespace

void add_slurm_check_command(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "slurm-check",
      "Check that this host's Slurm loads solar's SPANK plugin: an active solar_spank.so line "
      "in plugstack.conf (and what it includes), the plugin file there and built for this "
      "Slurm's major.minor release (read from the file: Slurm refuses a plugin of another "
      "release, and under an `optional` line jobs then silently run without solar), and the "
      "--solar-* options in `srun --help`. Exit 0 when all hold, 1 with each problem and its "
      "fix");
  auto plugstack = std::make_shared<std::string>();
  auto srun = std::make_shared<std::string>("srun");
  auto quiet = std::make_shared<bool>(false);
  cmd->add_option("--plugstack", *plugstack,
                  "plugstack.conf to read [plugstack.conf beside $SLURM_CONF, else "
                  "/etc/slurm/plugstack.conf]")
      ->type_name("FILE");
  cmd->add_option("--srun", *srun, "srun to ask for its version and --help [srun on PATH]")
      ->type_name("PROGRAM");
  cmd->add_flag("-q,--quiet", *quiet, "print only problems and the verdict");
  cmd->callback([=] { exit_code() = slurm_check(*plugstack, *srun, *quiet); });
}

}  // namespace solar::cli
