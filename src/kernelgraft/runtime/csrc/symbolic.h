// Programs on symbolic sizes, for the Meta kernel: under torch.export with a Dim, or fake tensors
// with a ShapeEnv, a tensor's sizes are c10::SymInts, and an output size must stay an expression
// of them (evaluating it on a concrete hint would specialise the dim). + - * // % min max and the
// comparisons are computed on SymInts (SymNode gives Python's // and %); ** / and the bitwise
// operators have no SymInt form and need their operands' concrete values, which specialises them.
// Concrete sizes never leave Program's own arithmetic, so they give exactly what run() gives.
//
// A meta rule gives the right output shapes wherever its guards hold, so any rule that holds will
// do; meta_shapes looks for one in three passes that cost the caller less and less freedom:
// a guard the ShapeEnv knows true already (no guard recorded), then a guard asked of the ShapeEnv
// (guard_bool: recorded, as Python's fake tensors do), then one that takes concrete values.
#pragma once

#include <c10/core/SymBool.h>
#include <c10/core/SymInt.h>

#include <string>
#include <vector>

#include "program.h"
#include "select.h"

namespace kgrt {

struct SymInput {
  bool is_tensor = false;
  std::vector<c10::SymInt> sizes;
  std::vector<c10::SymInt> strides;
  Value scalar = Value::error("the input is None or not a number");
};

struct SymValue {
  enum Kind : uint8_t { Concrete, Int, Bool } kind = Concrete;
  Value value;     // Concrete
  c10::SymInt i;   // Int: symbolic
  c10::SymBool b;  // Bool: symbolic
};

// How far an evaluation may go to decide a symbolic truth or value (see above).
enum class Freedom { Static, Guard, Specialize };

// The program's value; throws Undecided when `freedom` does not allow what deciding it needs.
struct Undecided {};
SymValue run_symbolic(const Program& program, const std::vector<SymInput>& inputs, Freedom freedom);

// Output shapes (SymInts) and dtypes from the op's meta rules (the first that holds), or false
// with `why` naming the op and the arguments.
bool meta_shapes(const OpEntry& op, const std::vector<ArgView>& args, const std::vector<SymInput>& inputs,
                 std::vector<std::vector<c10::SymInt>>* shapes, std::vector<std::string>* dtypes, std::string* why);

}  // namespace kgrt
