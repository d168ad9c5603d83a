# SPDX-License-Identifier: MIT
# cmake -DSCDOC=scdoc -DSOURCE=NAME.3.scd -DOUTPUT=NAME.3 -P render.cmake:
# renders one page with scdoc, then turns hyphenation off again after
# .TH.  scdoc writes its .nh before .TH, and groff's man macros, loaded at
# the first .TH (andoc.tmac loads an-old.tmac, which runs .hy), turn
# hyphenation back on: groff then split identifiers at line ends ("per-" /
# "cpu_ref_get_many"), which a reader cannot copy.
execute_process(COMMAND ${SCDOC} INPUT_FILE ${SOURCE} OUTPUT_VARIABLE page
                RESULT_VARIABLE status)
if(NOT status EQUAL 0)
  message(FATAL_ERROR "scdoc < ${SOURCE}: ${status}")
endif()
string(REGEX REPLACE "(\n\\.TH [^\n]*\n)" "\\1.nh\n" page "${page}")
if(NOT page MATCHES "\n\\.TH [^\n]*\n\\.nh\n")
  message(FATAL_ERROR "${SOURCE}: scdoc wrote no .TH line")
endif()
file(WRITE ${OUTPUT} "${page}")
