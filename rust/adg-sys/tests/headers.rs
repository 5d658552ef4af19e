//! Checks the bindings against the installed headers, without bindgen.
//!
//! The headers' text is parsed for what they declare: every `adg_*`
//! function (and its parameter count), every `ADG_*` constant (macros and
//! enumerators), every struct and its fields in order. The tables below
//! name what the bindings hold; a name missing on either side fails. A C
//! program, generated from the headers' lists and compiled with the
//! system's `cc` against the headers build.rs found, prints each
//! constant's value and each struct's size, alignment, and each field's
//! offset and size; they must equal the bindings' (`size_of`, `align_of`,
//! `offset_of!`).

use adg_sys as sys;
use std::collections::{BTreeMap, BTreeSet};
use std::mem::{align_of, offset_of, size_of};
use std::path::{Path, PathBuf};
use std::process::Command;

// ------------------------------------------------- what the bindings hold

/// Every function bound: naming one that does not exist fails to compile.
macro_rules! functions {
    ($($f:ident),* $(,)?) => {
        vec![$((stringify!($f), sys::$f as *const () as usize)),*]
    };
}

fn bound_functions() -> Vec<(&'static str, usize)> {
    functions![
        adg_strerror,
        adg_error_name,
        adg_errmsg,
        adg_version,
        adg_registry_new,
        adg_registry_free,
        adg_registry_allocator,
        adg_registry_stats,
        adg_step_give,
        adg_step_give_all,
        adg_leaf,
        adg_op,
        adg_node_ref,
        adg_node_unref,
        adg_node_id,
        adg_node_graph_id,
        adg_node_registry,
        adg_op_with,
        adg_op_moving,
        adg_output_get,
        adg_backward,
        adg_backward_with,
        adg_callback_site,
        adg_graph_visit,
        adg_graph_write_dot,
        adg_graph_write_dot_with,
        adg_reducer_new,
        adg_reducer_hook,
        adg_reducer_give,
        adg_reducer_next_unit,
        adg_reducer_unit_end,
        adg_reducer_end,
        adg_reducer_unit_end_with,
        adg_reducer_end_with,
        adg_reducer_rounds,
        adg_reducer_free,
        adg_pool_new_with,
        adg_pool_new,
        adg_pool_executor,
        adg_pool_free,
        adg_exact_new,
        adg_exact_free,
        adg_exact_length,
        adg_exact_clear,
        adg_exact_add,
        adg_exact_merge,
        adg_exact_round,
        adg_grads_get,
        adg_grads_take,
        adg_grads_get_node,
        adg_grads_take_node,
        adg_grads_register,
        adg_grads_count,
        adg_grads_free,
    ]
}

macro_rules! constants {
    ($($c:ident),* $(,)?) => {
        vec![$((stringify!($c), sys::$c as i128)),*]
    };
}

fn bound_constants() -> Vec<(&'static str, i128)> {
    constants![
        ADG_VERSION_MAJOR,
        ADG_VERSION_MINOR,
        ADG_VERSION_PATCH,
        ADG_OK,
        ADG_EINVAL,
        ADG_ENOMEM,
        ADG_EFOREIGN,
        ADG_ECONSUMED,
        ADG_EUNAVAILABLE,
        ADG_ENOIDS,
        ADG_ENOTFOUND,
        ADG_EBUSY,
        ADG_ECALLBACK,
        ADG_ESTATE,
        ADG_ETHREW,
        ADG_EVALUE,
        ADG_EUSER,
        ADG_ERRMSG_MAX,
        ADG_CHECKPOINT_NONE,
        ADG_CHECKPOINT_BALANCED,
        ADG_ID_MAX,
        ADG_EXECUTOR_MAX_WORKERS,
        ADG_FAILED_NOWHERE,
        ADG_FAILED_STEP,
        ADG_FAILED_ON_STEP,
        ADG_FAILED_ON_READY,
        ADG_FAILED_ADD,
        ADG_FAILED_CHECK,
        ADG_PARENT_OP,
        ADG_PARENT_LEAF,
        ADG_PARENT_CONSUMED,
        ADG_REDUCER_MAX_SLICES,
        ADG_REDUCER_MAX_UNITS,
        ADG_REDUCER_NO_UNIT,
        ADG_REDUCER_FAILED_NOWHERE,
        ADG_REDUCER_FAILED_RESULT,
        ADG_REDUCER_FAILED_ADD,
        ADG_REDUCER_FAILED_APPLY,
        ADG_REDUCER_FAILED_UNITS,
    ]
}

struct Layout {
    name: &'static str,
    size: usize,
    align: usize,
    /// (field, offset, size), in declaration order.
    fields: Vec<(&'static str, usize, usize)>,
}

fn field_size<S, F>(_: fn(&S) -> &F) -> usize {
    size_of::<F>()
}

/// Every struct bound with every field: the pattern in `exhaustive` fails
/// to compile when a Rust field is not listed.
macro_rules! layouts {
    ($($s:ident { $($f:ident),* $(,)? })*) => {
        vec![$({
            #[allow(deprecated, dead_code)]
            fn exhaustive(v: sys::$s) {
                let sys::$s { $($f: _),* } = v;
            }
            #[allow(deprecated)]
            Layout {
                name: stringify!($s),
                size: size_of::<sys::$s>(),
                align: align_of::<sys::$s>(),
                fields: vec![$((
                    stringify!($f),
                    offset_of!(sys::$s, $f),
                    field_size(|v: &sys::$s| &v.$f),
                )),*],
            }
        }),*]
    };
}

fn bound_layouts() -> Vec<Layout> {
    layouts! {
        adg_allocator { alloc, free, ctx }
        adg_registry_options { size, allocator, max_node_id, checkpointing, grad_ops }
        adg_stats {
            size, live_nodes, live_steps, live_graphs, merges, nodes_freed,
            slab_bytes, slab_bytes_huge,
        }
        adg_step_call {
            registry, grads, node_id, grad, parent_ids, n_parents, context,
            retained, pass_id,
        }
        adg_step { backward, release, user, name }
        adg_recompute_call { node_id, n_parents, parent_ids, parent_outputs, output }
        adg_output { value, free, recompute, memory_bound, ctx }
        adg_op_options { size, output, want_self, want_parents, n_want_parents, moved }
        adg_grad_ops { add, free, ctx }
        adg_executor { submit, ctx, n_workers }
        adg_step_event { node_id, name, after, duration_ns, result }
        adg_failure { size, code, site, node_id, name, pass_id }
        adg_backward_options {
            size, on_ready, on_ready_ctx, leaves_only, executor, on_step,
            on_step_ctx, retain, failure, value_check, value_check_ctx,
        }
        adg_graph_node {
            graph_id, id, name, depth, n_parents, parent_ids, parent_kinds,
        }
        adg_dot_options { size, leaf_name, leaf_name_ctx }
        adg_reduction {
            param, id, round, sum, slice, n_slices, first_unit, n_units,
        }
        adg_reducer_ops { add, apply, release, ctx, add_slice }
        adg_reducer_options {
            size, n_participants, n_units, param_ids, n_params, ops,
            first_unit, total_units, apply_early, allocator, param_slices,
        }
        adg_reducer_failure {
            size, code, site, round, participant, param_id, unit, step,
        }
        adg_pool_options { size, n_threads, allocator }
    }
}

// ------------------------------------------------ what the headers declare

const HEADERS: [&str; 4] = ["adg.h", "adg/reducer.h", "adg/pool.h", "adg/exact.h"];

/// The directory holding adg.h: among the include paths build.rs found
/// (none when the headers are in a default path pkg-config leaves out).
fn include_dir() -> PathBuf {
    let found = env!("ADG_SYS_INCLUDE_PATH");
    std::env::split_paths(found)
        .chain(["/usr/local/include".into(), "/usr/include".into()])
        .find(|d| d.join("adg.h").is_file())
        .expect("adg.h in the include paths build.rs found")
}

/// The text of a header with its comments removed.
fn header_text(dir: &Path, name: &str) -> String {
    let text = std::fs::read_to_string(dir.join(name)).expect("header");
    let mut out = String::with_capacity(text.len());
    let mut rest = text.as_str();
    while let Some(start) = rest.find("/*") {
        out.push_str(&rest[..start]);
        let end = rest[start..].find("*/").expect("closed comment");
        out.push(' ');
        rest = &rest[start + end + 2..];
    }
    out.push_str(rest);
    out
}

fn all_headers() -> String {
    let dir = include_dir();
    HEADERS
        .iter()
        .map(|h| header_text(&dir, h))
        .collect::<Vec<_>>()
        .join("\n")
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// The text between the bracket at `open` and its match.
fn balanced(text: &str, open: usize, left: char, right: char) -> &str {
    let mut depth = 0;
    for (i, c) in text[open..].char_indices() {
        if c == left {
            depth += 1;
        } else if c == right {
            depth -= 1;
            if depth == 0 {
                return &text[open + 1..open + i];
            }
        }
    }
    panic!("unbalanced {left}");
}

/// Splits at the commas (or `sep`) outside brackets.
fn split_top(text: &str, sep: char) -> Vec<&str> {
    let (mut depth, mut start, mut parts) = (0i32, 0, Vec::new());
    for (i, c) in text.char_indices() {
        match c {
            '(' | '{' | '[' => depth += 1,
            ')' | '}' | ']' => depth -= 1,
            c if c == sep && depth == 0 => {
                parts.push(&text[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&text[start..]);
    parts
}

fn count_params(params: &str) -> usize {
    let params = params.trim();
    if params.is_empty() || params == "void" {
        return 0;
    }
    split_top(params, ',').len()
}

/// Every function declared `ADG_API`, with its parameter count.
fn header_functions(text: &str) -> BTreeMap<String, usize> {
    let mut found = BTreeMap::new();
    for (at, _) in text.match_indices("ADG_API ") {
        let line_start = text[..at].rfind('\n').map_or(0, |i| i + 1);
        if text[line_start..at].trim_start().starts_with('#') {
            continue; /* the macro's own definition */
        }
        let open = at + text[at..].find('(').expect("prototype");
        let name_start = text[..open].rfind(|c| !is_ident(c)).unwrap() + 1;
        let name = &text[name_start..open];
        assert!(
            name.starts_with("adg_"),
            "an ADG_API that is not adg_*: {name}"
        );
        let params = balanced(text, open, '(', ')');
        found.insert(name.to_string(), count_params(params));
    }
    found
}

/// Every `ADG_*` constant: object-like macros with a value, enumerators,
/// and the error codes of ADG_ERROR_MAP.
fn header_constants(text: &str) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    for line in text.lines() {
        let Some(def) = line.trim_start().strip_prefix("#define ") else {
            continue;
        };
        let name: String = def.chars().take_while(|&c| is_ident(c)).collect();
        let value = def[name.len()..].trim();
        let function_like = def[name.len()..].starts_with('(');
        if name.starts_with("ADG_") && !function_like && !value.is_empty() && name != "ADG_API" {
            found.insert(name);
        }
    }
    for (at, _) in text.match_indices("enum ") {
        let rest = &text[at..];
        let Some(open) = rest.find(['{', ';', '(']) else {
            continue;
        };
        if rest.as_bytes()[open] != b'{' {
            continue; /* a use of an enum type, not its definition */
        }
        for item in split_top(balanced(rest, open, '{', '}'), ',') {
            let item = item.trim();
            let name: String = item.chars().take_while(|&c| is_ident(c)).collect();
            if name.starts_with("ADG_") && !item[name.len()..].trim_start().starts_with('(') {
                found.insert(name);
            }
        }
    }
    let map = text.find("#define ADG_ERROR_MAP").expect("ADG_ERROR_MAP");
    let map_end = map + text[map..].find("\n\n").expect("map's end");
    for (at, _) in text[map..map_end].match_indices("X(") {
        let item = &text[map + at + 2..];
        let name: String = item.chars().take_while(|&c| is_ident(c)).collect();
        if !name.is_empty() {
            found.insert(format!("ADG_{name}"));
        }
    }
    found
}

/// The field names of a struct body, in order.
fn fields_of(body: &str) -> Vec<String> {
    let mut fields = Vec::new();
    for decl in split_top(body, ';') {
        // A deprecation mark is not part of the declarator.
        let decl = match decl.find("ADG_DEPRECATED") {
            Some(at) => &decl[..at],
            None => decl,
        };
        let decl = decl.trim();
        if decl.is_empty() {
            continue;
        }
        // A function pointer: the name is in "(*name)".
        let name_part = match decl.find("(*") {
            Some(at) => &decl[at + 2..at + 2 + decl[at + 2..].find(')').unwrap()],
            None => decl,
        };
        // The last declarator of the line ("size_t slice, n_slices").
        for declarator in name_part.split(',') {
            let name: String = declarator
                .trim_end()
                .chars()
                .rev()
                .take_while(|&c| is_ident(c))
                .collect::<Vec<_>>()
                .into_iter()
                .rev()
                .collect();
            fields.push(name);
        }
    }
    fields
}

/// Every struct defined, with its fields.
fn header_structs(text: &str) -> BTreeMap<String, Vec<String>> {
    let mut found = BTreeMap::new();
    for (at, _) in text.match_indices("struct ") {
        if at > 0 && is_ident(text[..at].chars().next_back().unwrap()) {
            continue;
        }
        let rest = &text[at + "struct ".len()..];
        let name: String = rest.chars().take_while(|&c| is_ident(c)).collect();
        if !rest[name.len()..].trim_start().starts_with('{') {
            continue; /* a declaration or a use */
        }
        let open = name.len() + rest[name.len()..].find('{').unwrap();
        found.insert(name, fields_of(balanced(rest, open, '{', '}')));
    }
    found
}

/// Rust's parameter count of every `pub fn` in the bindings' source.
fn rust_param_counts() -> BTreeMap<String, usize> {
    let source = include_str!("../src/lib.rs");
    let mut found = BTreeMap::new();
    for (at, _) in source.match_indices("pub fn ") {
        let rest = &source[at + "pub fn ".len()..];
        let open = rest.find('(').unwrap();
        let params = balanced(rest, open, '(', ')');
        let n = split_top(params, ',')
            .iter()
            .filter(|p| !p.trim().is_empty())
            .count();
        found.insert(rest[..open].to_string(), n);
    }
    found
}

// ------------------------------------------------------------ C's answers

/// Compiles and runs a C program that prints, one per line,
/// `const NAME VALUE`, `struct NAME SIZE ALIGN` and
/// `field STRUCT NAME OFFSET SIZE`.
/// `tag` names its files: the tests run at once.
fn c_answers(
    tag: &str,
    constants: &BTreeSet<String>,
    structs: &BTreeMap<String, Vec<String>>,
) -> String {
    let mut c = String::from(
        "#include <adg.h>\n#include <stdalign.h>\n#include <stddef.h>\n\
         #include <stdio.h>\nint main(void)\n{\n",
    );
    for name in constants {
        c += &format!(
            "\tif ((long long)({name}) < 0 && ({name}) < 0)\n\
             \t\tprintf(\"const {name} %lld\\n\", (long long)({name}));\n\
             \telse\n\
             \t\tprintf(\"const {name} %llu\\n\", (unsigned long long)({name}));\n"
        );
    }
    for (name, fields) in structs {
        c += &format!(
            "\tprintf(\"struct {name} %zu %zu\\n\", sizeof(struct {name}), \
             alignof(struct {name}));\n"
        );
        for f in fields {
            c += &format!(
                "\tprintf(\"field {name} {f} %zu %zu\\n\", \
                 offsetof(struct {name}, {f}), sizeof(((struct {name} *)0)->{f}));\n"
            );
        }
    }
    c += "\treturn 0;\n}\n";
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("adg-sys-headers");
    std::fs::create_dir_all(&dir).unwrap();
    let (src, exe) = (dir.join(format!("{tag}.c")), dir.join(tag));
    std::fs::write(&src, c).unwrap();
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let status = Command::new(cc)
        .args(["-std=c11", "-Wno-deprecated-declarations", "-I"])
        .arg(include_dir())
        .arg(&src)
        .arg("-o")
        .arg(&exe)
        .status()
        .expect("the C compiler runs");
    assert!(status.success(), "compiling {}", src.display());
    let out = Command::new(&exe)
        .output()
        .expect("the layout program runs");
    assert!(out.status.success());
    String::from_utf8(out.stdout).unwrap()
}

// ------------------------------------------------------------------ tests

fn names<'a>(it: impl Iterator<Item = &'a str>) -> BTreeSet<String> {
    it.map(str::to_string).collect()
}

#[test]
fn every_function_is_bound_with_its_parameter_count() {
    let declared = header_functions(&all_headers());
    assert!(declared.len() > 40, "the parse found the functions");
    let bound = bound_functions();
    assert_eq!(
        names(bound.iter().map(|b| b.0)),
        declared.keys().cloned().collect()
    );
    for (name, address) in &bound {
        assert_ne!(*address, 0, "{name} resolved");
    }
    let rust = rust_param_counts();
    for (name, n) in &declared {
        assert_eq!(rust.get(name), Some(n), "parameters of {name}");
    }
}

#[test]
fn every_constant_is_bound_with_c_value() {
    let declared = header_constants(&all_headers());
    let bound = bound_constants();
    assert_eq!(names(bound.iter().map(|b| b.0)), declared);
    let answers = c_answers("constants", &declared, &BTreeMap::new());
    let mut seen = 0;
    for line in answers.lines() {
        let mut words = line.split(' ');
        assert_eq!(words.next(), Some("const"));
        let (name, value) = (words.next().unwrap(), words.next().unwrap());
        let c: i128 = value.parse().unwrap();
        let rust = bound.iter().find(|b| b.0 == name).unwrap().1;
        assert_eq!(rust, c, "value of {name}");
        seen += 1;
    }
    assert_eq!(seen, declared.len());
}

#[test]
fn every_struct_matches_c_layout() {
    let declared = header_structs(&all_headers());
    let bound = bound_layouts();
    assert_eq!(
        names(bound.iter().map(|l| l.name)),
        declared.keys().cloned().collect()
    );
    for layout in &bound {
        let c_fields = &declared[layout.name];
        let rust_fields: Vec<&str> = layout.fields.iter().map(|f| f.0).collect();
        assert_eq!(&rust_fields, c_fields, "fields of {}", layout.name);
    }
    let answers = c_answers("structs", &BTreeSet::new(), &declared);
    let mut checked = 0;
    for line in answers.lines() {
        let words: Vec<&str> = line.split(' ').collect();
        let num = |i: usize| -> usize { words[i].parse().unwrap() };
        let layout = bound.iter().find(|l| l.name == words[1]).unwrap();
        match words[0] {
            "struct" => {
                assert_eq!(layout.size, num(2), "size of {}", layout.name);
                assert_eq!(layout.align, num(3), "alignment of {}", layout.name);
            }
            "field" => {
                let f = layout.fields.iter().find(|f| f.0 == words[2]).unwrap();
                assert_eq!(f.1, num(3), "offset of {}.{}", layout.name, f.0);
                assert_eq!(f.2, num(4), "size of {}.{}", layout.name, f.0);
            }
            other => panic!("unexpected line {other}"),
        }
        checked += 1;
    }
    let fields: usize = bound.iter().map(|l| l.fields.len()).sum();
    assert_eq!(checked, bound.len() + fields);
}
