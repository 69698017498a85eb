/*
 * transport.c - what every backend shares: the destroy dispatch and the
 * typed "unsupported" stubs.
 */
#include "kvd_transport.h"

void kvd_transport_destroy(kvd_transport_t *t)
{
    if (t != NULL)
        t->ops->destroy(t);
}

int kvd_transport_post_unsupported(kvd_transport_t *t, kvd_xfer_dir_t dir,
                                   const kvd_xfer_t *xfers, size_t n, uint64_t cookie)
{
    (void)t;
    (void)dir;
    (void)xfers;
    (void)n;
    (void)cookie;
    return KVD_ERR_UNSUPPORTED;
}

int kvd_transport_poll_unsupported(kvd_transport_t *t, kvd_xfer_done_t *done, size_t max,
                                   size_t *n_done)
{
    (void)t;
    (void)done;
    (void)max;
    *n_done = 0;
    return KVD_ERR_UNSUPPORTED;
}
