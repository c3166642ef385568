# What `cmake --install` and `cpack -G DEB` put where. One place for every install rule, read
# after the whole project (docs/user-guide.md, "Installing"):
#
#   <bindir>                 solar, solar-agent, solar-stored, solar-example-train
#   <libdir>                 libsolar.so.0 (+ libsolar.so), libsolar-direct.so (libsolar's
#                            direct path, loaded from beside it), libsolar_preload.so
#   <SOLAR_SLURM_PLUGIN_DIR> solar_spank.so        (the plugin finds the programs above relative
#                                                   to itself: spank/CMakeLists.txt)
#   <includedir>/solar       solar.h, solar.hpp
#   <libdir>/cmake/solar     find_package(solar) -> solar::client
#   <libdir>/pkgconfig       solar.pc
#   <mandir>/man1            one page per program, from its --help (help2man, when found)
#   <docdir>                 README.md, slurm_examples/ (plugstack.conf, sbatch scripts)
#   SOLAR_PYTHON_DIR         the Python package (python/CMakeLists.txt)
#
# Programs find libsolar through a RUNPATH relative to themselves ($ORIGIN/../<libdir>), so an
# installed tree works wherever it is unpacked (a staging root, /opt/solar, /usr).
include(CMakePackageConfigHelpers)

file(RELATIVE_PATH solar_bin_to_lib "${CMAKE_INSTALL_FULL_BINDIR}" "${CMAKE_INSTALL_FULL_LIBDIR}")

set(solar_programs solar_cli solar-agent solar-stored solar-example-train)
foreach(t IN LISTS solar_programs)
  if(TARGET ${t})
    set_target_properties(${t} PROPERTIES INSTALL_RPATH "$ORIGIN/${solar_bin_to_lib}")
    install(TARGETS ${t} RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT runtime)
  endif()
endforeach()

if(TARGET solar_client)
  install(TARGETS solar_client EXPORT solarTargets
          LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT runtime
                  NAMELINK_COMPONENT runtime
          INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
  set_target_properties(solar_client PROPERTIES EXPORT_NAME client)
  # Beside libsolar, where libsolar looks for it on a rank's first direct read.
  install(TARGETS solar_client_direct LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
          COMPONENT runtime)
  install(FILES ${PROJECT_SOURCE_DIR}/client/include/solar/solar.h
                ${PROJECT_SOURCE_DIR}/client/include/solar/solar.hpp
          DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/solar COMPONENT runtime)

  # find_package(solar 0.1) -> solar::client (libsolar and its headers).
  install(EXPORT solarTargets NAMESPACE solar:: FILE solarTargets.cmake
          DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/solar COMPONENT runtime)
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
          DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/solar COMPONENT runtime)

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
          DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig COMPONENT runtime)
endif()

if(TARGET solar_preload)
  install(TARGETS solar_preload LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT runtime)
endif()
if(TARGET solar_spank)
  install(TARGETS solar_spank LIBRARY DESTINATION ${SOLAR_SLURM_PLUGIN_DIR} COMPONENT runtime)
endif()

install(FILES ${PROJECT_SOURCE_DIR}/README.md ${PROJECT_SOURCE_DIR}/LICENSE
              ${PROJECT_SOURCE_DIR}/packaging/debian/copyright
        DESTINATION ${CMAKE_INSTALL_DOCDIR} COMPONENT runtime)
install(DIRECTORY ${PROJECT_SOURCE_DIR}/docs/ DESTINATION ${CMAKE_INSTALL_DOCDIR}/docs
        COMPONENT runtime FILES_MATCHING PATTERN "*.md")
install(FILES ${PROJECT_SOURCE_DIR}/slurm_examples/README.md
              ${PROJECT_SOURCE_DIR}/slurm_examples/plugstack.conf
              ${PROJECT_SOURCE_DIR}/slurm_examples/train-example.sbatch
              ${PROJECT_SOURCE_DIR}/slurm_examples/train-pytorch.sbatch
              ${PROJECT_SOURCE_DIR}/slurm_examples/train_h5py_ddp.py
              ${PROJECT_SOURCE_DIR}/slurm_examples/train_h5py_files_ddp.py
        DESTINATION ${CMAKE_INSTALL_DOCDIR}/examples COMPONENT runtime)

# Environment modules (packaging/modules): an Lmod and a Tcl module that find the prefix from
# where they lie, so `module use <prefix>/share/solar/modulefiles` works for any --prefix.
foreach(kind lua tcl)
  configure_file(${PROJECT_SOURCE_DIR}/packaging/modules/solar.${kind}.in
                 ${PROJECT_BINARY_DIR}/modulefiles/solar.${kind} @ONLY)
endforeach()
install(FILES ${PROJECT_BINARY_DIR}/modulefiles/solar.lua
        DESTINATION ${CMAKE_INSTALL_DATADIR}/solar/modulefiles/solar
        RENAME ${PROJECT_VERSION}.lua COMPONENT runtime)
install(FILES ${PROJECT_BINARY_DIR}/modulefiles/solar.tcl
        DESTINATION ${CMAKE_INSTALL_DATADIR}/solar/modulefiles-tcl/solar
        RENAME ${PROJECT_VERSION} COMPONENT runtime)

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
    COMPONENT runtime)
  install(FILES ${PROJECT_SOURCE_DIR}/packaging/systemd/stored.conf.example
          DESTINATION ${CMAKE_INSTALL_DOCDIR}/examples COMPONENT runtime)
endif()

# Man pages from each program's --help and --version (help2man: scripts/install-deps).
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
    set(page ${PROJECT_BINARY_DIR}/man/${name}.1)
    add_custom_command(OUTPUT ${page}
      COMMAND ${CMAKE_COMMAND} -E make_directory ${PROJECT_BINARY_DIR}/man
      COMMAND ${SOLAR_HELP2MAN} --no-info --no-discard-stderr --section=1
              --name=${name} --version-string=${PROJECT_VERSION} --output=${page}
              $<TARGET_FILE:${t}>
      DEPENDS ${t} VERBATIM)
    list(APPEND solar_man_pages ${page})
  endforeach()
  add_custom_target(solar_man ALL DEPENDS ${solar_man_pages})
  install(FILES ${solar_man_pages} DESTINATION ${CMAKE_INSTALL_MANDIR}/man1 COMPONENT runtime)
else()
  message(STATUS "help2man not found: no man pages (scripts/install-deps installs it)")
endif()

# cpack -G DEB (or the target `deb`): build/package/solar_<version>_<arch>.deb, one package with
# everything above; its dependencies come from dpkg-shlibdeps, plus what scripts need.
set(CPACK_PACKAGE_NAME solar)
set(CPACK_PACKAGE_VENDOR "solar developers")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY
    "planned data loading for distributed deep-learning training (Slurm plugin, node agent, libsolar)")
set(CPACK_PACKAGE_DESCRIPTION
    "solar plans a shuffled training run's whole access order before the job starts and runs one node agent per node that fills a shared-memory buffer ahead of the ranks: a Slurm SPANK plugin (--solar-* options), solar-agent, solar-stored, libsolar (C, C++, Python), and the LD_PRELOAD interposer of the job-transparent mode.")
set(CPACK_PACKAGE_CONTACT "solar developers <solar@localhost>")
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_RESOURCE_FILE_LICENSE ${PROJECT_SOURCE_DIR}/LICENSE)
# Debian packages live under /usr whatever this build's prefix (/usr/local by default): every
# path above is relative to the prefix or to the installed file itself, so the tree is the same.
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_PACKAGE_DIRECTORY ${PROJECT_BINARY_DIR}/package)
set(CPACK_GENERATOR DEB)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SECTION science)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS ON)
# Python front end and the example job script; Slurm for the plugin is the site's own.
# libfabric1: opened on first use (dlopen, storage/src/fabric.cpp), so dpkg-shlibdeps does not
# see it in any program's NEEDED list.
set(CPACK_DEBIAN_PACKAGE_DEPENDS "python3, python3-numpy, libfabric1")
set(CPACK_DEBIAN_PACKAGE_RECOMMENDS "python3-torch, python3-h5py")
set(CPACK_DEBIAN_PACKAGE_SUGGESTS "slurm-client, slurmd")
set(CPACK_STRIP_FILES ON)
include(CPack)
add_custom_target(deb
  COMMAND ${CMAKE_CPACK_COMMAND} -G DEB --config ${PROJECT_BINARY_DIR}/CPackConfig.cmake
  WORKING_DIRECTORY ${PROJECT_BINARY_DIR}
  COMMENT "Debian package into ${PROJECT_BINARY_DIR}/package" VERBATIM)
