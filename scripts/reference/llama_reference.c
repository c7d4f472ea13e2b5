// Reference outputs from llama.cpp's library, for synaptix's golden files.
//
//   llama_reference MODEL.gguf PROMPT_FILE N_GEN LOGITS_OUT.f32
//
// Tokenizes the prompt file's bytes (or reads "ids:1,2,3") as llama-completion does (special tokens added and parsed),
// evaluates it on the CPU with flash attention off, writes the logits of the last prompt position
// (n_vocab little-endian f32) to LOGITS_OUT, then decodes greedily (arg-max, lowest id on ties)
// for up to N_GEN tokens, stopping after an end-of-generation token. Prints one JSON line:
//   {"prompt_ids":[...],"generated":[...]}
// Built and run by make_model_goldens.py.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ggml.h"
#include "llama.h"

// With DUMP_DIR set, every contiguous f32 tensor of the prompt's graph is written there as
// NAME.f32 (raw values; shape in NAME.shape as "ne0 ne1 ne2 ne3"), for layer-by-layer checks.
static const char *dump_dir = NULL;
static int dumping = 1;

static bool dump_cb(struct ggml_tensor *t, bool ask, void *data) {
    (void)data;
    if (ask) return dump_dir != NULL && dumping;
    if (t->type != GGML_TYPE_F32 || !ggml_is_contiguous(t)) return true;
    char path[1024];
    snprintf(path, sizeof path, "%s/%s.f32", dump_dir, t->name);
    FILE *f = fopen(path, "wb");
    if (f) { fwrite(t->data, 1, ggml_nbytes(t), f); fclose(f); }
    snprintf(path, sizeof path, "%s/%s.shape", dump_dir, t->name);
    f = fopen(path, "w");
    if (f) { fprintf(f, "%lld %lld %lld %lld\n", (long long)t->ne[0], (long long)t->ne[1], (long long)t->ne[2], (long long)t->ne[3]); fclose(f); }
    return true;
}

static void quiet(enum ggml_log_level level, const char *text, void *data) {
    (void)level; (void)text; (void)data;
}

static int argmax(const float *v, int n) {
    int best = 0;
    for (int i = 1; i < n; i++) if (v[i] > v[best]) best = i;
    return best;
}

int main(int argc, char **argv) {
    if (argc != 5) {
        fprintf(stderr, "usage: %s MODEL PROMPT_FILE N_GEN LOGITS_OUT\n", argv[0]);
        return 2;
    }
    FILE *pf = fopen(argv[2], "rb");
    if (!pf) { perror(argv[2]); return 1; }
    fseek(pf, 0, SEEK_END);
    long plen = ftell(pf);
    fseek(pf, 0, SEEK_SET);
    char *prompt = malloc(plen + 1);
    if (fread(prompt, 1, plen, pf) != (size_t)plen) { fprintf(stderr, "short read\n"); return 1; }
    prompt[plen] = 0;
    fclose(pf);
    int n_gen = atoi(argv[3]);

    llama_log_set(quiet, NULL);
    llama_backend_init();
    struct llama_model_params mp = llama_model_default_params();
    struct llama_model *model = llama_model_load_from_file(argv[1], mp);
    if (!model) { fprintf(stderr, "cannot load %s\n", argv[1]); return 1; }
    const struct llama_vocab *vocab = llama_model_get_vocab(model);
    int n_vocab = llama_vocab_n_tokens(vocab);

    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx = 4096;
    cp.n_batch = 4096;
    cp.n_ubatch = 512;
    cp.n_threads = 2;
    cp.n_threads_batch = 2;
    cp.flash_attn_type = getenv("FLASH_ATTN") ? LLAMA_FLASH_ATTN_TYPE_ENABLED : LLAMA_FLASH_ATTN_TYPE_DISABLED;
    dump_dir = getenv("DUMP_DIR");
    if (dump_dir) { cp.cb_eval = dump_cb; cp.cb_eval_user_data = NULL; }
    struct llama_context *ctx = llama_init_from_model(model, cp);
    if (!ctx) { fprintf(stderr, "cannot create context\n"); return 1; }

    int cap = (int)plen + 16;
    llama_token *ids = malloc(sizeof(llama_token) * cap);
    int n = 0;
    if (strncmp(prompt, "ids:", 4) == 0) {
        // Token ids given directly ("ids:1,2,3"), for models whose vocabulary is synthetic.
        for (char *p = prompt + 4; *p && n < cap; ) {
            ids[n++] = (llama_token)strtol(p, &p, 10);
            if (*p == ',') p++; else break;
        }
    } else {
        n = llama_tokenize(vocab, prompt, (int)plen, ids, cap, true, true);
        if (n < 0) { fprintf(stderr, "tokenize failed\n"); return 1; }
    }

    if (llama_decode(ctx, llama_batch_get_one(ids, n)) != 0) { fprintf(stderr, "decode failed\n"); return 1; }
    dumping = 0;
    const float *logits = llama_get_logits_ith(ctx, -1);
    FILE *lf = fopen(argv[4], "wb");
    if (!lf) { perror(argv[4]); return 1; }
    fwrite(logits, sizeof(float), n_vocab, lf);
    fclose(lf);

    printf("{\"prompt_ids\":[");
    for (int i = 0; i < n; i++) printf("%s%d", i ? "," : "", ids[i]);
    printf("],\"generated\":[");
    for (int step = 0; step < n_gen; step++) {
        llama_token tok = argmax(llama_get_logits_ith(ctx, -1), n_vocab);
        printf("%s%d", step ? "," : "", tok);
        if (llama_vocab_is_eog(vocab, tok)) break;
        if (llama_decode(ctx, llama_batch_get_one(&tok, 1)) != 0) { fprintf(stderr, "decode failed\n"); return 1; }
    }
    printf("]}\n");
    llama_free(ctx);
    llama_model_free(model);
    free(ids);
    free(prompt);
    return 0;
}
