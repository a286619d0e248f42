// What a valid bundle may hold: its caps, reserved names and kinds, as one table that both loaders
// read. The C++ runtime includes it (each row is an X-macro, expanded by spec.cpp and ops.cpp);
// kernelgraft/aot/bundle_spec.py parses the rows with a regular expression. So a cap changed here
// changes in both loaders at once, and the rules that use the rows are written out once, in that
// module's docstring, and checked against one corpus of tampered bundles
// (tests/integration/test_bundle_verdicts.py).
//
// The format is part of the contract: one row per line, `KG_ROW(arguments)` and nothing else on
// the line; numbers in decimal, names in double quotes.
//
// This file has no include guard on purpose: it is included once per expansion, with the macros
// its includer defines (the others expand to nothing).

#ifndef KG_LIMIT
#define KG_LIMIT(name, value)
#endif
#ifndef KG_VERSION
#define KG_VERSION(number, has_programs)
#endif
#ifndef KG_RESERVED_NAMESPACE
#define KG_RESERVED_NAMESPACE(name)
#endif
#ifndef KG_RESERVED_PARAM
#define KG_RESERVED_PARAM(name)
#endif
#ifndef KG_PARAM_KIND
#define KG_PARAM_KIND(kind, schema_type, tensor)
#endif
#ifndef KG_KERNEL_PARAM_KIND
#define KG_KERNEL_PARAM_KIND(kind)
#endif
#ifndef KG_IMAGE_KIND
#define KG_IMAGE_KIND(kind)
#endif
#ifndef KG_DTYPE
#define KG_DTYPE(name, scalar_type)
#endif
#ifndef KG_TRITON_TYPE
#define KG_TRITON_TYPE(dtype, triton)
#endif
#ifndef KG_C_TYPE
#define KG_C_TYPE(c_type, dtype)
#endif
#ifndef KG_STR_DEFAULT_CHARS
#define KG_STR_DEFAULT_CHARS(chars)
#endif

// Bytes. Every file is stat'ed before it is read and refused over its cap; each load charges
// every file it reads (manifest, signature, binaries, each file once) and each search of a cubin
// for its kernel's name to TOTAL_BYTES. For scale: five of the examples for two archs are a 2 MB
// manifest and 52 MB of binaries (1.6 MB the largest), all of which a signed load reads. The
// largest single file a bundle carries is the CuTe DSL runtime library of nvidia-cutlass-dsl 4.4
// and later (libcute_dsl_runtime.so, 43.6 MB in 4.8.1), once per bundle: FILE_BYTES leaves room
// for it.
KG_LIMIT(MANIFEST_BYTES, 33554432)
KG_LIMIT(SIGNATURE_BYTES, 4194304)
KG_LIMIT(FILE_BYTES, 67108864)
KG_LIMIT(TOTAL_BYTES, 268435456)
// Counts. JSON_DEPTH: containers nested in manifest.json and signature.json (the top level is 1).
KG_LIMIT(FILES, 16384)
KG_LIMIT(JSON_DEPTH, 32)
KG_LIMIT(ARCHS, 64)
KG_LIMIT(OPS, 256)
KG_LIMIT(PARAMS, 64)
KG_LIMIT(RETURNS, 64)
KG_LIMIT(CANDIDATES, 1024)
KG_LIMIT(KERNELS, 1024)
KG_LIMIT(KERNEL_PARAMS, 256)
KG_LIMIT(GUARDS, 256)
KG_LIMIT(DIMS, 64)
KG_LIMIT(DECISIONS, 4096)
KG_LIMIT(CONFIG_KEYS, 64)
// Characters. NAME: op, parameter, kernel, config key and file names; TEXT: every other string
// (labels, fingerprints, docs, string defaults, pinned values); EXPR: one expression's text;
// EXPR_DISTINCT: all distinct expression texts of the manifest together (each is compiled once).
KG_LIMIT(NAME_CHARS, 256)
KG_LIMIT(TEXT_CHARS, 4096)
KG_LIMIT(EXPR_CHARS, 2048)
KG_LIMIT(EXPR_DISTINCT_CHARS, 262144)
// Tokens of one RPN program, and of all programs of the manifest together.
KG_LIMIT(PROGRAM_TOKENS, 1024)
KG_LIMIT(PROGRAM_TOKENS_TOTAL, 1048576)

// Manifest versions; has_programs: every expression also as an RPN program in the form both
// loaders check (the C++ runtime reads only those versions). 2 and 3 held one program for all of
// a kernel's guards, the texts joined with " and " and no parentheses (a guard with a top-level
// `or` became another condition): their programs are not read, so the Python loader reads them by
// their texts, as 1, and the C++ runtime refuses them. 4: one program per guard.
KG_VERSION(1, 0)
KG_VERSION(2, 0)
KG_VERSION(3, 0)
KG_VERSION(4, 1)

// Op namespaces that belong to PyTorch.
KG_RESERVED_NAMESPACE("aten")
KG_RESERVED_NAMESPACE("prim")
KG_RESERVED_NAMESPACE("prims")
KG_RESERVED_NAMESPACE("torch")

// Parameter names an expression could not tell from its own syntax: Python's keywords, the
// functions of the expression grammar. (Names of the form out<digits> are the outputs'.)
KG_RESERVED_PARAM("False")
KG_RESERVED_PARAM("None")
KG_RESERVED_PARAM("True")
KG_RESERVED_PARAM("and")
KG_RESERVED_PARAM("as")
KG_RESERVED_PARAM("assert")
KG_RESERVED_PARAM("async")
KG_RESERVED_PARAM("await")
KG_RESERVED_PARAM("break")
KG_RESERVED_PARAM("class")
KG_RESERVED_PARAM("continue")
KG_RESERVED_PARAM("def")
KG_RESERVED_PARAM("del")
KG_RESERVED_PARAM("elif")
KG_RESERVED_PARAM("else")
KG_RESERVED_PARAM("except")
KG_RESERVED_PARAM("finally")
KG_RESERVED_PARAM("for")
KG_RESERVED_PARAM("from")
KG_RESERVED_PARAM("global")
KG_RESERVED_PARAM("if")
KG_RESERVED_PARAM("import")
KG_RESERVED_PARAM("in")
KG_RESERVED_PARAM("is")
KG_RESERVED_PARAM("lambda")
KG_RESERVED_PARAM("nonlocal")
KG_RESERVED_PARAM("not")
KG_RESERVED_PARAM("or")
KG_RESERVED_PARAM("pass")
KG_RESERVED_PARAM("raise")
KG_RESERVED_PARAM("return")
KG_RESERVED_PARAM("try")
KG_RESERVED_PARAM("while")
KG_RESERVED_PARAM("with")
KG_RESERVED_PARAM("yield")
KG_RESERVED_PARAM("min")
KG_RESERVED_PARAM("max")
KG_RESERVED_PARAM("next_pow2")

// An op parameter's kind, its type in the schema, and whether it is a tensor kind (only those
// may be mutated, and their default can only be None).
KG_PARAM_KIND("tensor", "Tensor", 1)
KG_PARAM_KIND("tensor_list", "Tensor[]", 1)
KG_PARAM_KIND("int", "SymInt", 0)
KG_PARAM_KIND("float", "float", 0)
KG_PARAM_KIND("bool", "bool", 0)
KG_PARAM_KIND("str", "str", 0)
KG_PARAM_KIND("dtype", "ScalarType", 0)

// A kernel parameter's kind: a pointer or a scalar of that width.
KG_KERNEL_PARAM_KIND("ptr")
KG_KERNEL_PARAM_KIND("i8")
KG_KERNEL_PARAM_KIND("i16")
KG_KERNEL_PARAM_KIND("i32")
KG_KERNEL_PARAM_KIND("i64")
KG_KERNEL_PARAM_KIND("u8")
KG_KERNEL_PARAM_KIND("u16")
KG_KERNEL_PARAM_KIND("u32")
KG_KERNEL_PARAM_KIND("u64")
KG_KERNEL_PARAM_KIND("f16")
KG_KERNEL_PARAM_KIND("f32")
KG_KERNEL_PARAM_KIND("f64")

// A kernel's images: a cubin and its PTX, or a CuTe DSL library and the runtime it needs.
KG_IMAGE_KIND("cubin")
KG_IMAGE_KIND("ptx")
KG_IMAGE_KIND("so")
KG_IMAGE_KIND("runtime")

// The dtypes a bundle may name (tensors, outputs, dtype defaults), with their ATen ScalarType.
KG_DTYPE("float32", Float)
KG_DTYPE("float16", Half)
KG_DTYPE("bfloat16", BFloat16)
KG_DTYPE("float64", Double)
KG_DTYPE("int8", Char)
KG_DTYPE("int16", Short)
KG_DTYPE("int32", Int)
KG_DTYPE("int64", Long)
KG_DTYPE("uint8", Byte)
KG_DTYPE("bool", Bool)
KG_DTYPE("float8_e4m3fn", Float8_e4m3fn)
KG_DTYPE("float8_e5m2", Float8_e5m2)
KG_DTYPE("complex64", ComplexFloat)

// Pointer types as compilers record them: Triton's signature (a dtype without a row here is not
// checked) and CUDA C++ template arguments. The manifest's dtypes must agree with them.
KG_TRITON_TYPE("float32", "fp32")
KG_TRITON_TYPE("float16", "fp16")
KG_TRITON_TYPE("bfloat16", "bf16")
KG_TRITON_TYPE("float64", "fp64")
KG_TRITON_TYPE("int8", "i8")
KG_TRITON_TYPE("int16", "i16")
KG_TRITON_TYPE("int32", "i32")
KG_TRITON_TYPE("int64", "i64")
KG_TRITON_TYPE("uint8", "u8")
KG_TRITON_TYPE("bool", "i1")
KG_TRITON_TYPE("float8_e4m3fn", "fp8e4nv")
KG_TRITON_TYPE("float8_e5m2", "fp8e5")
KG_C_TYPE("float", "float32")
KG_C_TYPE("double", "float64")
KG_C_TYPE("__half", "float16")
KG_C_TYPE("half", "float16")
KG_C_TYPE("__nv_bfloat16", "bfloat16")

// The characters a string default may hold (it is written into the schema between double quotes,
// so no quote, backslash, comma or parenthesis can end it or add a parameter).
KG_STR_DEFAULT_CHARS("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.:/+- ")

#undef KG_LIMIT
#undef KG_VERSION
#undef KG_RESERVED_NAMESPACE
#undef KG_RESERVED_PARAM
#undef KG_PARAM_KIND
#undef KG_KERNEL_PARAM_KIND
#undef KG_IMAGE_KIND
#undef KG_DTYPE
#undef KG_TRITON_TYPE
#undef KG_C_TYPE
#undef KG_STR_DEFAULT_CHARS
