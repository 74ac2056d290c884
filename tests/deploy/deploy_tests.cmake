# Tests of deploy/ (included from tests/services/coordinator/CMakeLists.txt, which sees the
# service targets).
include_guard(GLOBAL)
if(TARGET specd-coordinator AND TARGET specd_draft_worker AND TARGET specd_target_worker)
  add_test(NAME deploy_compose_test
           COMMAND /usr/bin/python3 ${CMAKE_SOURCE_DIR}/tests/deploy/compose_test.py
                   ${CMAKE_SOURCE_DIR} ${CMAKE_BINARY_DIR}
                   specd=$<TARGET_FILE:specd>
                   specd-coordinator=$<TARGET_FILE:specd-coordinator>
                   specd-draft-worker=$<TARGET_FILE:specd_draft_worker>
                   specd-target-worker=$<TARGET_FILE:specd_target_worker>)
  set_tests_properties(deploy_compose_test PROPERTIES LABELS "deploy" TIMEOUT 120)

  # The stack for real: installs and starts the Docker engine, builds the images and brings the
  # compose file up (see the script). Exit status 77 is a skip: no engine can run here.
  add_test(NAME deploy_compose_stack_test
           COMMAND /usr/bin/python3 ${CMAKE_SOURCE_DIR}/tests/deploy/compose_stack_test.py
                   ${CMAKE_SOURCE_DIR} ${CMAKE_BINARY_DIR})
  set_tests_properties(deploy_compose_stack_test PROPERTIES
                       LABELS "deploy;containers" TIMEOUT 1500 SKIP_RETURN_CODE 77
                       COST 90)  # started first: see tests/fuzz/CMakeLists.txt
endif()
