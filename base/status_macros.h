// Status propagation helpers in the style of Abseil/gRPC internal macros.
#ifndef SPECD_BASE_STATUS_MACROS_H_
#define SPECD_BASE_STATUS_MACROS_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define SPECD_STATUS_CONCAT_INNER_(a, b) a##b
#define SPECD_STATUS_CONCAT_(a, b) SPECD_STATUS_CONCAT_INNER_(a, b)

// Returns from the enclosing function if `expr` (an absl::Status) is not OK.
#define SPECD_RETURN_IF_ERROR(expr)                \
  do {                                             \
    const absl::Status specd_status_ = (expr);     \
    if (!specd_status_.ok()) return specd_status_; \
  } while (0)

// `SPECD_ASSIGN_OR_RETURN(auto x, MakeX());` assigns the value or returns the error.
#define SPECD_ASSIGN_OR_RETURN(lhs, expr) \
  SPECD_ASSIGN_OR_RETURN_IMPL_(SPECD_STATUS_CONCAT_(specd_statusor_, __LINE__), lhs, expr)
#define SPECD_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, expr)  \
  auto statusor = (expr);                                  \
  if (!statusor.ok()) return std::move(statusor).status(); \
  lhs = std::move(statusor).value()

#endif  // SPECD_BASE_STATUS_MACROS_H_
