# Tests of deploy/ (included from tests/services/coordinator/CMakeLists.txt, which sees the
# service targets).
include_guard(GLOBAL)
if(TARGET specd-coordinator AND TARGET specd_draft_worker AND TARGET specd_target_worker)
  add_test(NAME deploy_compose_test
           COMMAND /usr/bin/python3 ${CMAKE_SOURCE_DIR}/tests/deploy/compose_test.py
                   ${CMAKE_SOURCE_DIR}
                   specd=$<TARGET_FILE:specd>
                   specd-coordinator=$<TARGET_FILE:specd-coordinator>
                   specd-draft-worker=$<TARGET_FILE:specd_draft_worker>
                   specd-target-worker=$<TARGET_FILE:specd_target_worker>)
  set_tests_properties(deploy_compose_test PROPERTIES LABELS "deploy" TIMEOUT 120)
endif()
