// Dot-product and dequantization goldens from ggml's CPU backend, for synaptix's kernel tests.
//
//   ggml_vecdot_reference FIXTURE_DIR
//
// Meant to be linked against a PORTABLE llama.cpp build (every SIMD option off, no FMA; see
// make_vecdot_goldens.sh), whose arithmetic is the plain C of ggml's *_ref quantizers and
// *_generic dot products: that is the reference synaptix's kernels reproduce bit for bit.
//
// Reads FIXTURE_DIR/dot_cases.txt, lines "TYPE N K M", and FIXTURE_DIR/dot_x.f32, a row-major f32
// activation matrix of `index.json`'s dot_x.rows x dot_x.cols (DOT_X_COLS below). For each case:
//   dot_TYPE.bin       (input)  N weight rows of K elements of TYPE, ggml's row layout;
//   dot_TYPE.acts.bin  (output) the first K columns of each of the M activation rows converted by
//                      the CPU backend's from_float of TYPE's vec_dot_type, rows concatenated;
//   dot_TYPE.out.f32   (output) M x N little-endian f32, element [i][j] = vec_dot(weight row j,
//                      activation row i), the layout of y = x * W^T.
// The same products are also computed through a ggml_mul_mat graph (one thread) and must be
// identical to the vec_dot results, which checks that a matmul is exactly one vec_dot per output.
// For every TYPE it also writes TYPE.ggml.f32: ggml's to_float of the small fixture TYPE.bin
// (compared in the tests with gguf-py's TYPE.f32 and with synaptix's dequantization).
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ggml.h"
#include "ggml-cpu.h"

#define DOT_X_COLS 1024

static const char *dir;

static void *read_file(const char *name, size_t *len) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "rb");
    if (!f) { perror(path); exit(1); }
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    void *buf = malloc(n > 0 ? (size_t)n : 1);
    if (fread(buf, 1, (size_t)n, f) != (size_t)n) { fprintf(stderr, "%s: short read\n", path); exit(1); }
    fclose(f);
    *len = (size_t)n;
    return buf;
}

static void write_file(const char *name, const void *data, size_t len) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(data, 1, len, f) != len) { perror(path); exit(1); }
    fclose(f);
}

// The ggml type whose name matches `name` ignoring case ("q4_k" is GGML_TYPE_Q4_K).
static enum ggml_type type_by_name(const char *name) {
    for (int t = 0; t < GGML_TYPE_COUNT; t++) {
        const char *tn = ggml_type_name((enum ggml_type)t);
        if (!tn || strlen(tn) != strlen(name)) continue;
        size_t i = 0;
        while (name[i] && tolower((unsigned char)name[i]) == tolower((unsigned char)tn[i])) i++;
        if (!name[i]) return (enum ggml_type)t;
    }
    fprintf(stderr, "unknown type %s\n", name);
    exit(1);
}

// y[i*n + j] for the whole case through ggml_mul_mat (weights n x k, activations m x k).
static void mul_mat_graph(enum ggml_type type, const void *w, const float *x, int n, int k, int m,
                          float *y) {
    size_t need = ggml_row_size(type, k) * n + sizeof(float) * (size_t)k * m + sizeof(float) * n * m
                  + 64 * 1024 * 1024;
    struct ggml_init_params params = { need, NULL, false };
    struct ggml_context *ctx = ggml_init(params);
    struct ggml_tensor *tw = ggml_new_tensor_2d(ctx, type, k, n);
    struct ggml_tensor *tx = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, k, m);
    memcpy(tw->data, w, ggml_nbytes(tw));
    memcpy(tx->data, x, ggml_nbytes(tx));
    struct ggml_tensor *ty = ggml_mul_mat(ctx, tw, tx);  // ne = [n, m]
    struct ggml_cgraph *gf = ggml_new_graph(ctx);
    ggml_build_forward_expand(gf, ty);
    if (ggml_graph_compute_with_ctx(ctx, gf, 1) != GGML_STATUS_SUCCESS) {
        fprintf(stderr, "graph compute failed\n");
        exit(1);
    }
    memcpy(y, ty->data, sizeof(float) * (size_t)n * m);
    ggml_free(ctx);
}

static void run_case(const char *name, int n, int k, int m, const float *xall, int xrows) {
    enum ggml_type type = type_by_name(name);
    const struct ggml_type_traits_cpu *tc = ggml_get_type_traits_cpu(type);
    enum ggml_type act_type = tc->vec_dot_type;
    const struct ggml_type_traits_cpu *ta = ggml_get_type_traits_cpu(act_type);
    if (!tc->vec_dot || (act_type != GGML_TYPE_F32 && !ta->from_float) || m > xrows || k > DOT_X_COLS) {
        fprintf(stderr, "%s: unsupported case\n", name);
        exit(1);
    }
    char file[256];
    size_t wlen;
    snprintf(file, sizeof file, "dot_%s.bin", name);
    unsigned char *w = read_file(file, &wlen);
    size_t wrow = ggml_row_size(type, k);
    if (wlen != wrow * (size_t)n) {
        fprintf(stderr, "%s: %zu bytes, expected %d rows of %zu\n", file, wlen, n, wrow);
        exit(1);
    }

    // Activation rows: the first k columns of each row of dot_x.
    float *x = malloc(sizeof(float) * (size_t)k * m);
    for (int i = 0; i < m; i++) memcpy(x + (size_t)i * k, xall + (size_t)i * DOT_X_COLS, sizeof(float) * k);

    size_t arow = ggml_row_size(act_type, k);
    unsigned char *acts = calloc((size_t)m, arow);  // zeroed: Q8_K leaves bsums of all-zero blocks unset
    for (int i = 0; i < m; i++) {
        if (act_type == GGML_TYPE_F32) {
            memcpy(acts + i * arow, x + (size_t)i * k, arow);
        } else {
            ta->from_float(x + (size_t)i * k, acts + i * arow, k);
        }
    }

    float *y = malloc(sizeof(float) * (size_t)n * m);
    for (int i = 0; i < m; i++) {
        for (int j = 0; j < n; j++) {
            tc->vec_dot(k, &y[(size_t)i * n + j], 0, w + j * wrow, 0, acts + i * arow, 0, 1);
        }
    }

    float *yg = malloc(sizeof(float) * (size_t)n * m);
    mul_mat_graph(type, w, x, n, k, m, yg);
    if (memcmp(y, yg, sizeof(float) * (size_t)n * m) != 0) {
        fprintf(stderr, "%s: ggml_mul_mat differs from vec_dot\n", name);
        exit(1);
    }

    snprintf(file, sizeof file, "dot_%s.acts.bin", name);
    write_file(file, acts, arow * m);
    snprintf(file, sizeof file, "dot_%s.out.f32", name);
    write_file(file, y, sizeof(float) * (size_t)n * m);

    // Dequantization of the small fixture blocks.
    size_t blen;
    snprintf(file, sizeof file, "%s.bin", name);
    unsigned char *blocks = read_file(file, &blen);
    size_t bs = ggml_type_size(type);
    int64_t count = (int64_t)(blen / bs) * ggml_blck_size(type);
    float *deq = malloc(sizeof(float) * (size_t)(count > 0 ? count : 1));
    if (type == GGML_TYPE_F32) {
        memcpy(deq, blocks, blen);
    } else {
        ggml_get_type_traits(type)->to_float(blocks, deq, count);
    }
    snprintf(file, sizeof file, "%s.ggml.f32", name);
    write_file(file, deq, sizeof(float) * (size_t)count);

    printf("%-5s n=%d k=%d m=%d acts=%s (%zu bytes/row)\n", name, n, k, m, ggml_type_name(act_type), arow);
    free(w); free(x); free(acts); free(y); free(yg); free(blocks); free(deq);
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s FIXTURE_DIR\n", argv[0]);
        return 2;
    }
    dir = argv[1];
    ggml_cpu_init();

    size_t xlen;
    float *xall = read_file("dot_x.f32", &xlen);
    int xrows = (int)(xlen / (sizeof(float) * DOT_X_COLS));

    size_t clen;
    char *cases = read_file("dot_cases.txt", &clen);
    cases = realloc(cases, clen + 1);
    cases[clen] = 0;
    for (char *line = strtok(cases, "\n"); line; line = strtok(NULL, "\n")) {
        char name[32];
        int n, k, m;
        if (sscanf(line, "%31s %d %d %d", name, &n, &k, &m) != 4) {
            fprintf(stderr, "bad line: %s\n", line);
            return 1;
        }
        run_case(name, n, k, m, xall, xrows);
    }
    free(cases);
    free(xall);
    return 0;
}
