/* The default KV pool (engine_plan_room): every sequence's whole context, cut to the
 * largest block count whose plan fits the host's room (and the GPU's, from the device plan
 * cuda_plan_make computes without a device), never below one context; a pool the caller
 * sized (kv_blocks, kv_budget_bytes) is never cut. The default context is the model's own,
 * cut to what fits. On the tiny llama-f32 model. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
#include "engine/engine_device.h"
#include "engine/engine_plan.h"
#include "hearth.h"
#include "tiny_model_path.h"
#include "model/model.h"
#include <stdio.h>
#include <stdlib.h>

static hearth_model *hm;
static model *m;

static int setup(void **state) {
    (void)state;
    char path[1024];
    tiny_model_path(path, sizeof path, "llama-f32");
    hearth_error err = {0};
    if (hearth_model_open(path, &hm, &err) || model_plan(hm, 0, &m, &err)) {
        fprintf(stderr, "tiny model missing (%s): %s; run tools/make_tiny_models.py\n", path, err.message);
        return -1;
    }
    return 0;
}

static int teardown(void **state) {
    (void)state;
    model_free(m);
    hearth_model_close(hm);
    return 0;
}

static const hearth_engine_options opts = {.context_length = 1000, .max_sequences = 6, .n_threads = 1};
#define CTX_BLOCKS 63 /* 1000 positions in blocks of 16 */

static engine_plan host_plan(const hearth_engine_options *o, size_t room) {
    engine_plan p;
    hearth_error err = {0};
    assert_int_equal(engine_plan_host(m, o, room, &p, &err), HEARTH_OK);
    return p;
}

static void test_full_pool_when_it_fits(void **state) {
    (void)state;
    engine_plan p = host_plan(&opts, 0); /* 0: room unknown, no cut */
    assert_int_equal(p.n_blocks, 6 * CTX_BLOCKS);
    assert_int_equal(p.kv_cut_from, 0);
    engine_plan q = host_plan(&opts, engine_plan_bytes(&p)); /* exactly enough */
    assert_int_equal(q.n_blocks, 6 * CTX_BLOCKS);
    assert_int_equal(q.kv_cut_from, 0);
}

static void test_cut_is_the_largest_that_fits(void **state) {
    (void)state;
    engine_plan full = host_plan(&opts, 0);
    for (int shrink = 1; shrink <= 4; shrink++) {
        size_t room = engine_plan_bytes(&full) - full.kv * (size_t)shrink / 5; /* a fifth of the pool less, ... */
        engine_plan p = host_plan(&opts, room);
        assert_int_equal(p.kv_cut_from, 6 * CTX_BLOCKS);
        assert_true(p.n_blocks < 6 * CTX_BLOCKS && p.n_blocks >= CTX_BLOCKS);
        assert_true(engine_plan_bytes(&p) <= room);
        hearth_engine_options one_more = opts;
        one_more.kv_blocks = p.n_blocks + 1;
        engine_plan q = host_plan(&one_more, 0);
        assert_true(engine_plan_bytes(&q) > room); /* maximal */
        /* everything else in the plan is the full plan's */
        assert_int_equal(p.context, full.context);
        assert_int_equal(p.max_seqs, full.max_seqs);
        assert_true(p.weights == full.weights && p.buffers == full.buffers);
    }
}

static void test_floor_is_one_context(void **state) {
    (void)state;
    engine_plan p = host_plan(&opts, 1); /* no room at all */
    assert_int_equal(p.n_blocks, CTX_BLOCKS);
    assert_int_equal(p.kv_cut_from, 6 * CTX_BLOCKS);
}

static void test_sized_pools_are_not_cut(void **state) {
    (void)state;
    hearth_engine_options o = opts;
    o.kv_blocks = 500;
    engine_plan p = host_plan(&o, 1);
    assert_int_equal(p.n_blocks, 500);
    assert_int_equal(p.kv_cut_from, 0);
    o.kv_blocks = 0;
    o.kv_budget_bytes = 64.0 * 1024 * 1024;
    engine_plan q = host_plan(&o, 1);
    assert_int_equal(q.kv_cut_from, 0);
    assert_true(q.n_blocks > CTX_BLOCKS); /* what 64 MiB holds, not the floor */
}

static void test_device_room_cuts_too(void **state) {
    (void)state;
    engine_plan full = host_plan(&opts, 0);
    size_t dev_full = engine_device_plan_bytes(model_ops(m), &full, HEARTH_KV_FLOAT, 0, 0);
    assert_true(dev_full > 0);
    engine_plan p;
    hearth_error err = {0};
    /* halfway between one context's pool and the full one (the plan's fixed part, weights
     * and scratch, is most of a tiny model's device bytes) */
    hearth_engine_options one = opts;
    one.kv_blocks = CTX_BLOCKS;
    engine_plan floor_plan = host_plan(&one, 0);
    size_t dev_floor = engine_device_plan_bytes(model_ops(m), &floor_plan, HEARTH_KV_FLOAT, 0, 0);
    assert_true(dev_floor < dev_full);
    size_t room = dev_floor + (dev_full - dev_floor) / 2;
    assert_int_equal(engine_plan_rooms(m, &opts, 0, room, &p, &err), HEARTH_OK);
    assert_int_equal(p.kv_cut_from, 6 * CTX_BLOCKS);
    assert_true(p.n_blocks < 6 * CTX_BLOCKS);
    assert_true(engine_device_plan_bytes(model_ops(m), &p, HEARTH_KV_FLOAT, 0, 0) <= room);
    /* both rooms: the tighter one decides */
    engine_plan h = host_plan(&opts, engine_plan_bytes(&full) - full.kv / 2);
    assert_int_equal(engine_plan_rooms(m, &opts, engine_plan_bytes(&h), room, &p, &err), HEARTH_OK);
    assert_true(p.n_blocks <= h.n_blocks);
    assert_true(engine_device_plan_bytes(model_ops(m), &p, HEARTH_KV_FLOAT, 0, 0) <= room);
    /* the device reserve: a twentieth of the total, at least 1 GiB */
    assert_int_equal(engine_device_room((size_t)100 << 30, (size_t)140 << 30), ((size_t)100 << 30) - ((size_t)7 << 30));
    assert_int_equal(engine_device_room((size_t)8 << 30, (size_t)8 << 30), (size_t)7 << 30);
    assert_int_equal(engine_device_room((size_t)512 << 20, (size_t)8 << 30), 1);
}

/* No context asked for: the model's own limit (131072 for this model), and where not even
 * one sequence of it fits, the largest context that does (the pool then one context). */
static void test_default_context_is_the_models(void **state) {
    (void)state;
    hearth_engine_options o = {.max_sequences = 4, .n_threads = 1};
    engine_plan p = host_plan(&o, 0);
    assert_int_equal(p.context, m->cfg.context_length);
    assert_true(p.context > 8192);
    assert_int_equal(p.context_cut_from, 0);
    /* room for the full pool of one sequence less half its KV: the context is cut */
    hearth_engine_options one = o;
    one.kv_blocks = (p.context + 15) / 16;
    engine_plan solo = host_plan(&one, 0);
    size_t room = engine_plan_bytes(&solo) - solo.kv / 2;
    engine_plan c = host_plan(&o, room);
    assert_int_equal(c.context_cut_from, m->cfg.context_length);
    assert_true(c.context < m->cfg.context_length && c.context > 0);
    assert_int_equal(c.n_blocks, (c.context + 15) / 16);
    assert_true(engine_plan_bytes(&c) <= room);
    hearth_engine_options longer = o; /* maximal: one position more does not fit */
    longer.context_length = c.context + 1;
    longer.kv_blocks = (c.context + 1 + 15) / 16;
    engine_plan q = host_plan(&longer, 0);
    assert_true(engine_plan_bytes(&q) > room || q.n_blocks == c.n_blocks);
    /* a context asked for is never cut: the pool keeps its floor of one context */
    hearth_engine_options asked = o;
    asked.context_length = p.context;
    engine_plan a = host_plan(&asked, room);
    assert_int_equal(a.context, p.context);
    assert_int_equal(a.context_cut_from, 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_default_context_is_the_models),
        cmocka_unit_test(test_full_pool_when_it_fits), cmocka_unit_test(test_cut_is_the_largest_that_fits),
        cmocka_unit_test(test_floor_is_one_context),   cmocka_unit_test(test_sized_pools_are_not_cut),
        cmocka_unit_test(test_device_room_cuts_too),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
