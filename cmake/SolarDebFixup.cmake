# SPDX-License-Identifier: Apache-2.0
# Run by cpack after it made the Debian packages (CPACK_POST_BUILD_SCRIPTS, SolarInstall.cmake),
# to finish them as debhelper would (lintian --pedantic: tests/install/test_package.py):
# - ELF files lose the .comment and .note sections CPack's plain `strip` leaves (dh_strip:
#   --remove-section=.comment --remove-section=.note; lintian's binary-has-unneeded-section),
#   and DEBIAN/md5sums is written again for the changed files;
# - a package that activates dpkg's ldconfig trigger loses the postinst and postrm CPack wrote
#   for it, which do nothing but call ldconfig (lintian: maintscript-calls-ldconfig).
# Each is rebuilt with dpkg-deb, files owned by root, as dpkg-buildpackage makes them.
foreach(deb IN LISTS CPACK_PACKAGE_FILES)
  if(NOT deb MATCHES "\\.deb$")
    continue()
  endif()
  set(tree ${deb}.tree)
  file(REMOVE_RECURSE ${tree})
  execute_process(COMMAND dpkg-deb -R ${deb} ${tree} COMMAND_ERROR_IS_FATAL ANY)

  if(EXISTS ${tree}/DEBIAN/triggers)
    foreach(script postinst postrm)
      if(EXISTS ${tree}/DEBIAN/${script})
        file(STRINGS ${tree}/DEBIAN/${script} lines)
        list(FILTER lines EXCLUDE REGEX "^(#!.*|set -e|if .*configure.*|if .*remove.*|fi|[ \t]*ldconfig|[ \t]*)$")
        if(lines)
          message(FATAL_ERROR "${deb}: ${script} does more than call ldconfig: ${lines}")
        endif()
        file(REMOVE ${tree}/DEBIAN/${script})
      endif()
    endforeach()
  endif()

  file(GLOB_RECURSE files LIST_DIRECTORIES false RELATIVE ${tree} ${tree}/*)
  list(FILTER files EXCLUDE REGEX "^DEBIAN/")
  list(SORT files)
  set(md5sums "")
  foreach(f IN LISTS files)
    if(IS_SYMLINK ${tree}/${f})
      continue()
    endif()
    file(READ ${tree}/${f} magic LIMIT 4 HEX)
    if(magic STREQUAL "7f454c46")
      execute_process(COMMAND strip --remove-section=.comment --remove-section=.note
                              ${tree}/${f} COMMAND_ERROR_IS_FATAL ANY)
    endif()
    file(MD5 ${tree}/${f} sum)
    string(APPEND md5sums "${sum}  ${f}\n")
  endforeach()
  file(WRITE ${tree}/DEBIAN/md5sums "${md5sums}")
  file(CHMOD ${tree}/DEBIAN/md5sums PERMISSIONS OWNER_READ OWNER_WRITE GROUP_READ WORLD_READ)

  execute_process(COMMAND dpkg-deb --root-owner-group -Zxz --build ${tree} ${deb}
                  OUTPUT_QUIET COMMAND_ERROR_IS_FATAL ANY)
  file(REMOVE_RECURSE ${tree})
endforeach()
