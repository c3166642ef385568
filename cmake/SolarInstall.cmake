# SPDX-License-Identifier: Apache-2.0
# What `cmake --install` and `cpack -G DEB` put where. One place for every install rule, read
# after the whole project (docs/user-guide.md, "Installing"). Each rule belongs to a component,
# and each component is one Debian package (packaging/README.md), so a compute node gets only
# what it runs:
#
#   solar (tools)       <bindir>: solar, solar-agent, solar-stored, solar-example-train;
#                       <libdir>/solar/libsolar_preload.so; man pages; docs and examples; the
#                       solar-stored unit; the environment modules
#   libsolar0 (lib)     <libdir>/libsolar.so.0*; <libdir>/solar/libsolar-direct.so (libsolar's
#                       direct path, opened from there on first use)
#   libsolar-dev (dev)  <includedir>/solar (solar.h, solar.hpp), <libdir>/libsolar.so,
#                       <libdir>/cmake/solar (find_package(solar) -> solar::client), solar.pc
#   python3-solar       SOLAR_PYTHON_DIR: the Python package (python/CMakeLists.txt)
#     (python)
#   solar-slurm-plugin  <SOLAR_SLURM_PLUGIN_DIR>/solar_spank.so (it finds the programs above
#     (slurm)           relative to itself: spank/CMakeLists.txt), /etc/slurm/plugstack.conf.d/
#                       solar.conf (commented: the admin enables it), solar_spank(8)
#
# <libdir> is lib/<multiarch> (top-level CMakeLists.txt). Programs find libsolar through a
# RUNPATH relative to themselves ($ORIGIN/../<libdir>), so an installed tree works wherever it
# is unpacked (a staging root, /opt/solar, /usr). Files only a Debian package needs (copyright
# and changelog per package, lintian overrides, the plugstack.conf.d snippet under /etc) are
# EXCLUDE_FROM_ALL: cpack installs them, a plain `cmake --install` does not.
include(CMakePackageConfigHelpers)

file(RELATIVE_PATH solar_bin_to_lib "${CMAKE_INSTALL_FULL_BINDIR}" "${CMAKE_INSTALL_FULL_LIBDIR}")

set(solar_programs solar_cli solar-agent solar-stored solar-example-train)
foreach(t IN LISTS solar_programs)
  if(TARGET ${t})
    set_target_properties(${t} PROPERTIES INSTALL_RPATH "$ORIGIN/${solar_bin_to_lib}")
    install(TARGETS ${t} RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT tools)
  endif()
endforeach()

if(TARGET solar_client)
  install(TARGETS solar_client EXPORT solarTargets
          LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT lib NAMELINK_COMPONENT dev
          INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
  set_target_properties(solar_client PROPERTIES EXPORT_NAME client)
  # In libsolar's private folder, where libsolar looks for it on a rank's first direct read.
  install(TARGETS solar_client_direct LIBRARY DESTINATION ${SOLAR_PRIVATE_LIBDIR} COMPONENT lib)
  install(FILES ${PROJECT_SOURCE_DIR}/client/include/solar/solar.h
                ${PROJECT_SOURCE_DIR}/client/include/solar/solar.hpp
          DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/solar COMPONENT dev)

  # find_package(solar 0.1) -> solar::client (libsolar and its headers).
  install(EXPORT solarTargets NAMESPACE solar:: FILE solarTargets.cmake
          DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/solar COMPONENT dev)
  file(WRITE ${PROJECT_BINARY_DIR}/solarConfig.cmake.in [=[
@PACKAGE_INIT@
# solar::client: libsolar (solar.h, solar.hpp), the library a training rank links.
include("${CMAKE_CURRENT_LIST_DIR}/solarTargets.cmake")
check_required_components(solar)
]=])
  configure_package_config_file(${PROJECT_BINARY_DIR}/solarConfig.cmake.in
    ${PROJECT_BINARY_DIR}/solarConfig.cmake
    INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/solar)
  write_basic_package_version_file(${PROJECT_BINARY_DIR}/solarConfigVersion.cmake
    COMPATIBILITY SameMajorVersion)
  install(FILES ${PROJECT_BINARY_DIR}/solarConfig.cmake
                ${PROJECT_BINARY_DIR}/solarConfigVersion.cmake
          DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/solar COMPONENT dev)

  # pkg-config --cflags --libs solar. Relative to ${pcfiledir}, so a relocated tree is right.
  file(RELATIVE_PATH solar_pc_to_prefix "${CMAKE_INSTALL_FULL_LIBDIR}/pkgconfig"
       "${CMAKE_INSTALL_PREFIX}")
  string(REGEX REPLACE "/$" "" solar_pc_to_prefix "${solar_pc_to_prefix}")
  file(WRITE ${PROJECT_BINARY_DIR}/solar.pc
"prefix=\${pcfiledir}/${solar_pc_to_prefix}
libdir=\${prefix}/${CMAKE_INSTALL_LIBDIR}
includedir=\${prefix}/${CMAKE_INSTALL_INCLUDEDIR}

Name: solar
Description: libsolar: a training rank's planned batches from the solar node agent
Version: ${PROJECT_VERSION}
Cflags: -I\${includedir}
Libs: -L\${libdir} -lsolar
")
  install(FILES ${PROJECT_BINARY_DIR}/solar.pc
          DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig COMPONENT dev)
endif()

if(TARGET solar_preload)
  install(TARGETS solar_preload LIBRARY DESTINATION ${SOLAR_PRIVATE_LIBDIR} COMPONENT tools)
endif()
if(TARGET solar_spank)
  install(TARGETS solar_spank LIBRARY DESTINATION ${SOLAR_SLURM_PLUGIN_DIR} COMPONENT slurm)
endif()

install(FILES ${PROJECT_SOURCE_DIR}/README.md ${PROJECT_SOURCE_DIR}/packaging/debian/copyright
        DESTINATION ${CMAKE_INSTALL_DOCDIR} COMPONENT tools)
# The license text beside them in a prefix install; a component no package takes, as Debian's
# copyright file names Apache-2.0 and /usr/share/common-licenses holds its text.
install(FILES ${PROJECT_SOURCE_DIR}/LICENSE DESTINATION ${CMAKE_INSTALL_DOCDIR}
        COMPONENT license)
install(DIRECTORY ${PROJECT_SOURCE_DIR}/docs/ DESTINATION ${CMAKE_INSTALL_DOCDIR}/docs
        COMPONENT tools FILES_MATCHING PATTERN "*.md")
install(FILES ${PROJECT_SOURCE_DIR}/slurm_examples/README.md
              ${PROJECT_SOURCE_DIR}/slurm_examples/plugstack.conf
              ${PROJECT_SOURCE_DIR}/slurm_examples/train-example.sbatch
              ${PROJECT_SOURCE_DIR}/slurm_examples/train-pytorch.sbatch
              ${PROJECT_SOURCE_DIR}/slurm_examples/train_h5py_ddp.py
              ${PROJECT_SOURCE_DIR}/slurm_examples/train_h5py_files_ddp.py
        DESTINATION ${CMAKE_INSTALL_DOCDIR}/examples COMPONENT tools)

# Environment modules (packaging/modules): an Lmod and a Tcl module that find the prefix from
# where they lie, so `module use <prefix>/share/solar/modulefiles` works for any --prefix.
foreach(kind lua tcl)
  configure_file(${PROJECT_SOURCE_DIR}/packaging/modules/solar.${kind}.in
                 ${PROJECT_BINARY_DIR}/modulefiles/solar.${kind} @ONLY)
endforeach()
install(FILES ${PROJECT_BINARY_DIR}/modulefiles/solar.lua
        DESTINATION ${CMAKE_INSTALL_DATADIR}/solar/modulefiles/solar
        RENAME ${PROJECT_VERSION}.lua COMPONENT tools)
install(FILES ${PROJECT_BINARY_DIR}/modulefiles/solar.tcl
        DESTINATION ${CMAKE_INSTALL_DATADIR}/solar/modulefiles-tcl/solar
        RENAME ${PROJECT_VERSION} COMPONENT tools)

# solar-stored as a systemd service (packaging/systemd): the unit, its program the one of the
# prefix installed to (known at install time: cpack installs to /usr), in <prefix>/lib/systemd/
# system, and the example configuration it reads. The build's own copy (for the tests) names
# this configuration's prefix.
set(SOLAR_STORED_PATH ${CMAKE_INSTALL_FULL_BINDIR}/solar-stored)
configure_file(${PROJECT_SOURCE_DIR}/packaging/systemd/solar-stored@.service.in
               ${PROJECT_BINARY_DIR}/systemd/solar-stored@.service @ONLY)
if(TARGET solar-stored)
  install(CODE "
    set(SOLAR_STORED_PATH \"\${CMAKE_INSTALL_PREFIX}/${CMAKE_INSTALL_BINDIR}/solar-stored\")
    configure_file(\"${PROJECT_SOURCE_DIR}/packaging/systemd/solar-stored@.service.in\"
                   \"${PROJECT_BINARY_DIR}/systemd/install/solar-stored@.service\" @ONLY)
    file(INSTALL DESTINATION \"\${CMAKE_INSTALL_PREFIX}/lib/systemd/system\" TYPE FILE
         FILES \"${PROJECT_BINARY_DIR}/systemd/install/solar-stored@.service\")"
    COMPONENT tools)
  install(FILES ${PROJECT_SOURCE_DIR}/packaging/systemd/stored.conf.example
          DESTINATION ${CMAKE_INSTALL_DOCDIR}/examples COMPONENT tools)
endif()

# Man pages: each program's --help and --version through help2man, with the real text of
# packaging/man/<program>.h2m (NAME, DESCRIPTION, ENVIRONMENT, FILES, SEE ALSO) and, for solar,
# every subcommand's --help (packaging/man/make_page.py); solar_spank(8), the plugin's
# plugstack.conf arguments and --solar-* options, is written by hand. All gzip -9n, as Debian
# installs them. help2man: scripts/install-deps.
find_program(SOLAR_HELP2MAN help2man)
if(SOLAR_HELP2MAN)
  set(solar_man_pages)
  foreach(t IN LISTS solar_programs)
    if(NOT TARGET ${t})
      continue()
    endif()
    get_target_property(name ${t} OUTPUT_NAME)
    if(NOT name)
      set(name ${t})
    endif()
    set(page ${PROJECT_BINARY_DIR}/man/${name}.1.gz)
    add_custom_command(OUTPUT ${page}
      COMMAND /usr/bin/python3 ${PROJECT_SOURCE_DIR}/packaging/man/make_page.py
              --help2man ${SOLAR_HELP2MAN} --version ${PROJECT_VERSION}
              --include ${PROJECT_SOURCE_DIR}/packaging/man/${name}.h2m --output ${page}
              $<TARGET_FILE:${t}>
      DEPENDS ${t} ${PROJECT_SOURCE_DIR}/packaging/man/make_page.py
              ${PROJECT_SOURCE_DIR}/packaging/man/${name}.h2m
      VERBATIM)
    list(APPEND solar_man_pages ${page})
  endforeach()
  set(solar_spank_page)
  if(TARGET solar_spank)
    set(solar_spank_page ${PROJECT_BINARY_DIR}/man/solar_spank.8.gz)
    add_custom_command(OUTPUT ${solar_spank_page}
      COMMAND /usr/bin/python3 ${PROJECT_SOURCE_DIR}/packaging/man/make_page.py
              --version ${PROJECT_VERSION} --page ${PROJECT_SOURCE_DIR}/packaging/man/solar_spank.8
              --options $<TARGET_FILE:solar_spank_man_options>
              --set SLURM=${SOLAR_SLURM_VERSION} --set SLURM_RELEASE=${SOLAR_SLURM_RELEASE}
              --output ${solar_spank_page}
      DEPENDS solar_spank_man_options ${PROJECT_SOURCE_DIR}/packaging/man/make_page.py
              ${PROJECT_SOURCE_DIR}/packaging/man/solar_spank.8
      VERBATIM)
  endif()
  add_custom_target(solar_man ALL DEPENDS ${solar_man_pages} ${solar_spank_page})
  install(FILES ${solar_man_pages} DESTINATION ${CMAKE_INSTALL_MANDIR}/man1 COMPONENT tools)
  if(TARGET solar_spank)
    install(FILES ${solar_spank_page} DESTINATION ${CMAKE_INSTALL_MANDIR}/man8 COMPONENT slurm)
  endif()
else()
  message(STATUS "help2man not found: no man pages (scripts/install-deps installs it)")
endif()

# The Debian packages: one per component, installed under /usr.
set(solar_packages tools solar lib libsolar0 dev libsolar-dev python python3-solar)
if(TARGET solar_spank)
  list(APPEND solar_packages slurm solar-slurm-plugin)
endif()

# What only a Debian package carries (EXCLUDE_FROM_ALL: not in a plain `cmake --install`): its
# copyright file and changelog in /usr/share/doc/<package>, lintian's overrides, and the
# plugin's commented plugstack.conf.d snippet (a conffile: the admin's edits survive upgrades).
set(solar_changelog ${PROJECT_BINARY_DIR}/debian/changelog.gz)
add_custom_command(OUTPUT ${solar_changelog}
  COMMAND ${CMAKE_COMMAND} -E make_directory ${PROJECT_BINARY_DIR}/debian
  COMMAND sh -c "gzip -9n -c '${PROJECT_SOURCE_DIR}/packaging/debian/changelog' > '${solar_changelog}'"
  DEPENDS ${PROJECT_SOURCE_DIR}/packaging/debian/changelog VERBATIM)
add_custom_target(solar_debian_changelog ALL DEPENDS ${solar_changelog})
while(solar_packages)
  list(POP_FRONT solar_packages component package)
  install(FILES ${PROJECT_SOURCE_DIR}/packaging/debian/copyright ${solar_changelog}
          DESTINATION ${CMAKE_INSTALL_DATAROOTDIR}/doc/${package}
          COMPONENT ${component} EXCLUDE_FROM_ALL)
  if(EXISTS ${PROJECT_SOURCE_DIR}/packaging/debian/${package}.lintian-overrides)
    install(FILES ${PROJECT_SOURCE_DIR}/packaging/debian/${package}.lintian-overrides
            DESTINATION ${CMAKE_INSTALL_DATAROOTDIR}/lintian/overrides RENAME ${package}
            COMPONENT ${component} EXCLUDE_FROM_ALL)
  endif()
  string(TOUPPER ${component} C)
  set(CPACK_DEBIAN_${C}_PACKAGE_NAME ${package})
  set(CPACK_DEBIAN_${C}_FILE_NAME DEB-DEFAULT)
  list(APPEND solar_components ${component})
endwhile()
if(TARGET solar_spank)
  # The snippet names the plugin's path in the package (cpack installs to /usr) and is
  # installed to an absolute /etc, whatever the prefix.
  if(IS_ABSOLUTE "${SOLAR_SLURM_PLUGIN_DIR}")
    set(SOLAR_DEB_PLUGIN "${SOLAR_SLURM_PLUGIN_DIR}/solar_spank.so")
  else()
    set(SOLAR_DEB_PLUGIN "/usr/${SOLAR_SLURM_PLUGIN_DIR}/solar_spank.so")
  endif()
  configure_file(${PROJECT_SOURCE_DIR}/packaging/debian/solar.conf
                 ${PROJECT_BINARY_DIR}/debian/slurm/solar.conf @ONLY)
  install(FILES ${PROJECT_BINARY_DIR}/debian/slurm/solar.conf
          DESTINATION /etc/slurm/plugstack.conf.d COMPONENT slurm EXCLUDE_FROM_ALL)
  file(WRITE ${PROJECT_BINARY_DIR}/debian/slurm/conffiles "/etc/slurm/plugstack.conf.d/solar.conf\n")
endif()

# The Slurm release the plugin was built against (spank/CMakeLists.txt: SOLAR_SLURM_VERSION,
# from slurm/slurm_version.h). Slurm loads a SPANK plugin only when its plugin_version has the
# same major.minor (22.05.x: any micro); otherwise srun and slurmd print "Incompatible Slurm
# plugin ... version" and, under an `optional` line, go on without it. Debian's slurmd and
# slurm-client both depend on exactly their version of slurm-wlm-basic-plugins, so depending on
# that package within the plugin's major.minor is depending on the Slurm ABI: apt refuses a
# mismatched pair (packaging/README.md).
if(TARGET solar_spank)
  set(CPACK_DEBIAN_SLURM_PACKAGE_DEPENDS
      "slurm-wlm-basic-plugins (>= ${SOLAR_SLURM_RELEASE}~), slurm-wlm-basic-plugins (<< ${SOLAR_SLURM_NEXT_RELEASE}~)")
  set(CPACK_COMPONENT_SLURM_DEPENDS tools)
  set(CPACK_DEBIAN_SLURM_PACKAGE_ENHANCES "slurmd, slurm-client")
  set(CPACK_DEBIAN_SLURM_PACKAGE_CONTROL_EXTRA ${PROJECT_BINARY_DIR}/debian/slurm/conffiles)
  set(CPACK_COMPONENT_SLURM_DESCRIPTION
"solar's Slurm SPANK plugin (--solar-* options of srun and sbatch)
solar_spank.so adds --solar-dataset, --solar-buffer and the other --solar-*
options to srun and sbatch, computes the run's plan when a step starts,
launches one solar node agent per node and stops it after the step. Built for
Slurm ${SOLAR_SLURM_VERSION}: Slurm loads it only with the same major.minor
release (${SOLAR_SLURM_RELEASE}). Enable it in
/etc/slurm/plugstack.conf.d/solar.conf on every node and submit host.")
endif()

set(CPACK_PACKAGE_NAME solar)
set(CPACK_PACKAGE_VENDOR "solar developers")
# No CPACK_PACKAGE_DESCRIPTION_SUMMARY: each package's synopsis is the first line of its
# component's description (CPack would prepend the summary to every one of them).
set(CPACK_PACKAGE_CONTACT "solar developers <solar-developers@lists.example.org>")
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_RESOURCE_FILE_LICENSE ${PROJECT_SOURCE_DIR}/LICENSE)
# Debian packages live under /usr whatever this build's prefix (/usr/local by default): every
# path above is relative to the prefix or to the installed file itself, so the tree is the same.
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_PACKAGE_DIRECTORY ${SOLAR_DEB_DIR})
set(CPACK_GENERATOR DEB)
set(CPACK_DEB_COMPONENT_INSTALL ON)
set(CPACK_COMPONENTS_ALL ${solar_components})
set(CPACK_DEBIAN_ENABLE_COMPONENT_DEPENDS ON)
set(CPACK_DEBIAN_PACKAGE_SECTION science)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
# dpkg-shlibdeps runs in each component's staging folder; the programs' libsolar.so.0 lies in
# libsolar0's (lib), beside it. Found there, it adds nothing: the component dependency below
# (libsolar0 (= version)) is the package's dependency on it.
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS_PRIVATE_DIRS ../lib/usr/${CMAKE_INSTALL_LIBDIR})
set(CPACK_STRIP_FILES ON)
set(CPACK_DEBIAN_PACKAGE_HOMEPAGE "https://example.invalid/solar")

# solar: the programs and the interposer. libfabric1: opened on first use (dlopen,
# storage/src/fabric.cpp), so dpkg-shlibdeps does not see it in any program's NEEDED list.
set(CPACK_COMPONENT_TOOLS_DESCRIPTION
"planned data loading for distributed deep-learning training
solar plans a shuffled training run's whole access order before the job starts
and runs one node agent per node that fills a shared-memory buffer ahead of
the ranks. This package has the solar tool (solar run: the same on one machine
without Slurm; plan, gen, verify, bench, stat, report), the node agent
solar-agent, the storage server solar-stored (libfabric RMA, with a systemd
unit), the LD_PRELOAD interposer of the job-transparent mode, and an example
training program.")
set(CPACK_COMPONENT_TOOLS_DEPENDS lib)
set(CPACK_DEBIAN_TOOLS_PACKAGE_DEPENDS "libfabric1")
set(CPACK_DEBIAN_TOOLS_PACKAGE_RECOMMENDS "python3-solar")
set(CPACK_DEBIAN_TOOLS_PACKAGE_SUGGESTS "solar-slurm-plugin")

# libsolar0: the library a rank links, and its direct path (serial HDF5, libfabric on first use).
set(CPACK_COMPONENT_LIB_DESCRIPTION
"solar's client library: a training rank's planned batches
libsolar attaches a training rank to the solar node agent's shared-memory
buffer and hands it zero-copy batches in the planned order; with no agent it
reads the same samples from the dataset itself (HDF5, or solar-stored over
libfabric), so one script runs anywhere.")
set(CPACK_DEBIAN_LIB_PACKAGE_SECTION libs)
set(CPACK_DEBIAN_LIB_PACKAGE_DEPENDS "libfabric1")
# Its shlibs file, so that packages built against libsolar.so.0 depend on this version or later
# (CPack's GENERATE_SHLIBS is for all packages at once, with "=").
file(WRITE ${PROJECT_BINARY_DIR}/debian/lib/shlibs "libsolar 0 libsolar0 (>= ${PROJECT_VERSION})\n")
# ldconfig through dpkg's trigger, as debhelper does; CPack's postinst/postrm that only call
# ldconfig are taken out again after packaging (SolarDebFixup.cmake: lintian's
# maintscript-calls-ldconfig).
file(WRITE ${PROJECT_BINARY_DIR}/debian/lib/triggers "activate-noawait ldconfig\n")
set(CPACK_DEBIAN_LIB_PACKAGE_CONTROL_EXTRA ${PROJECT_BINARY_DIR}/debian/lib/triggers
    ${PROJECT_BINARY_DIR}/debian/lib/shlibs)
set(CPACK_POST_BUILD_SCRIPTS ${PROJECT_SOURCE_DIR}/cmake/SolarDebFixup.cmake)

set(CPACK_COMPONENT_DEV_DESCRIPTION
"solar's client library: development files
Headers (solar/solar.h for C, solar/solar.hpp for C++), find_package(solar)
(solar::client) and pkg-config's solar.pc, for programs that read their
training batches through libsolar.")
set(CPACK_COMPONENT_DEV_DEPENDS lib)
set(CPACK_DEBIAN_DEV_PACKAGE_SECTION libdevel)
set(CPACK_DEBIAN_DEV_PACKAGE_SHLIBDEPS OFF)

set(CPACK_COMPONENT_PYTHON_DESCRIPTION
"solar's Python front end (PyTorch DataLoader replacement)
import solar: a training script's batches from the solar node agent
(solar.Loader, a DataLoader-like iterable with a sampler and set_epoch), or
read directly without one.")
set(CPACK_COMPONENT_PYTHON_DEPENDS lib)
set(CPACK_DEBIAN_PYTHON_PACKAGE_SECTION python)
set(CPACK_DEBIAN_PYTHON_PACKAGE_SHLIBDEPS OFF)
set(CPACK_DEBIAN_PYTHON_PACKAGE_DEPENDS "python3, python3-numpy")
set(CPACK_DEBIAN_PYTHON_PACKAGE_RECOMMENDS "python3-torch, python3-h5py")

include(CPack)
add_custom_target(deb
  COMMAND ${CMAKE_COMMAND} -E rm -rf ${SOLAR_DEB_DIR}
  COMMAND ${CMAKE_CPACK_COMMAND} -G DEB --config ${PROJECT_BINARY_DIR}/CPackConfig.cmake
  WORKING_DIRECTORY ${PROJECT_BINARY_DIR}
  COMMENT "Debian packages into ${SOLAR_DEB_DIR}" VERBATIM)
