"""Hard built-in Code-v0 problems (written for llm-zoo)."""

from code_problems.common import array_input, rng, spec

_r = rng(303)


def _weighted_edges(n: int, m: int, max_w: int) -> str:
    lines = [f"{_r.randint(1, n)} {_r.randint(1, n)} {_r.randint(1, max_w)}\n" for _ in range(m)]
    return f"{n} {m}\n" + "".join(lines)


def _tree(n: int, weighted: bool) -> list[str]:
    return [
        f"{_r.randint(1, v - 1)} {v}" + (f" {_r.randint(1, 1000)}" if weighted else "") + "\n"
        for v in range(2, n + 1)
    ]


PROBLEMS = [
    spec(
        "cheapest-route",
        "Cheapest Route",
        "hard",
        """
        A country has n cities and m one-way roads; road i goes from u_i to v_i and costs w_i. Find the
        cheapest way to travel from city 1 to city n.

        Input
        The first line contains n and m (2 <= n <= 10^5, 0 <= m <= 2 * 10^5). Each of the next m lines
        contains u, v, w (1 <= u, v <= n, 1 <= w <= 10^9).

        Output
        Print the least total cost of a route from city 1 to city n, or -1 if there is none.

        Example
        Input:
        4 5
        1 2 4
        1 3 1
        3 2 2
        2 4 5
        3 4 10
        Output:
        8
        """,
        """
        import sys
        import heapq
        data = list(map(int, sys.stdin.read().split()))
        n, m = data[0], data[1]
        adj = [[] for _ in range(n + 1)]
        for i in range(m):
            u, v, w = data[2 + 3 * i: 5 + 3 * i]
            adj[u].append((v, w))
        INF = float("inf")
        dist = [INF] * (n + 1)
        dist[1] = 0
        heap = [(0, 1)]
        while heap:
            d, u = heapq.heappop(heap)
            if d > dist[u]:
                continue
            for v, w in adj[u]:
                if d + w < dist[v]:
                    dist[v] = d + w
                    heapq.heappush(heap, (d + w, v))
        print(dist[n] if dist[n] < INF else -1)
        """,
        [
            "4 5\n1 2 4\n1 3 1\n3 2 2\n2 4 5\n3 4 10\n",
            "2 0\n",
            "2 1\n2 1 5\n",
            "3 3\n1 2 1000000000\n2 3 1000000000\n1 3 1999999999\n",
            "3 2\n1 1 3\n1 3 7\n",
            _weighted_edges(2000, 8000, 1000),
        ],
    ),
    spec(
        "inversions",
        "Counting Inversions",
        "hard",
        """
        An inversion of an array is a pair of positions i < j with a_i > a_j. Count the inversions.

        Input
        The first line contains n (1 <= n <= 2 * 10^5). The second line contains n integers
        (-10^9 <= a_i <= 10^9).

        Output
        Print the number of inversions.

        Example
        Input:
        5
        3 1 2 5 4
        Output:
        3
        """,
        """
        import sys
        data = list(map(int, sys.stdin.read().split()))
        n = data[0]
        a = data[1:1 + n]
        ranks = {v: i + 1 for i, v in enumerate(sorted(set(a)))}
        size = len(ranks)
        tree = [0] * (size + 1)
        inversions = 0
        for seen, x in enumerate(a):
            r = ranks[x]
            i, not_greater = r, 0
            while i > 0:
                not_greater += tree[i]
                i -= i & -i
            inversions += seen - not_greater
            i = r
            while i <= size:
                tree[i] += 1
                i += i & -i
        print(inversions)
        """,
        [
            "5\n3 1 2 5 4\n",
            "1\n7\n",
            "4\n2 2 2 2\n",
            "6\n6 5 4 3 2 1\n",
            "5\n-1 -2 1000000000 -1000000000 0\n",
            array_input(_r.randint(-(10**9), 10**9) for _ in range(20000)),
        ],
    ),
    spec(
        "longest-palindrome",
        "Longest Palindromic Substring",
        "hard",
        """
        Find the length of the longest contiguous substring of s that reads the same forwards and
        backwards.

        Input
        One line with a string s of 1 to 10^5 lowercase letters.

        Output
        Print the length of the longest palindromic substring.

        Example
        Input:
        forgeeksskeegfor
        Output:
        10
        """,
        """
        s = input().strip()
        t = "^#" + "#".join(s) + "#$"
        radius = [0] * len(t)
        center = right = 0
        for i in range(1, len(t) - 1):
            if i < right:
                radius[i] = min(right - i, radius[2 * center - i])
            while t[i + radius[i] + 1] == t[i - radius[i] - 1]:
                radius[i] += 1
            if i + radius[i] > right:
                center, right = i, i + radius[i]
        print(max(radius))
        """,
        [
            "forgeeksskeegfor\n",
            "a\n",
            "ab\n",
            "aaaa\n",
            "abacdfgdcaba\n",
            "".join(_r.choice("ab") for _ in range(20000)) + "\n",
            "xyz" + "ab" * 10000 + "a" + "zyx\n",
        ],
    ),
    spec(
        "cheapest-network",
        "Cheapest Network",
        "hard",
        """
        n offices must be linked into one network. There are m possible cables; cable i links offices
        u_i and v_i and costs w_i. Choose cables so that every office can reach every other one through
        chosen cables, at the least total cost.

        Input
        The first line contains n and m (1 <= n <= 10^5, 0 <= m <= 2 * 10^5). Each of the next m lines
        contains u, v, w (1 <= u, v <= n, 1 <= w <= 10^9).

        Output
        Print the least total cost, or IMPOSSIBLE if the offices cannot all be linked.

        Example
        Input:
        4 5
        1 2 3
        2 3 1
        3 4 4
        1 4 2
        1 3 5
        Output:
        6
        """,
        """
        import sys
        data = list(map(int, sys.stdin.read().split()))
        n, m = data[0], data[1]
        edges = sorted((data[4 + 3 * i], data[2 + 3 * i], data[3 + 3 * i]) for i in range(m))
        parent = list(range(n + 1))
        def find(x):
            while parent[x] != x:
                parent[x] = parent[parent[x]]
                x = parent[x]
            return x
        total, used = 0, 0
        for w, u, v in edges:
            a, b = find(u), find(v)
            if a != b:
                parent[a] = b
                total += w
                used += 1
        print(total if used == n - 1 else "IMPOSSIBLE")
        """,
        [
            "4 5\n1 2 3\n2 3 1\n3 4 4\n1 4 2\n1 3 5\n",
            "1 0\n",
            "3 1\n1 2 5\n",
            "2 3\n1 2 10\n2 1 3\n1 1 1\n",
            "3 3\n1 2 1000000000\n2 3 1000000000\n1 3 1000000000\n",
            _weighted_edges(800, 3000, 10**6),
        ],
    ),
    spec(
        "range-sums",
        "Updates and Range Sums",
        "hard",
        """
        Maintain an array a_1 ... a_n under q operations of two kinds:
        "1 i x": set a_i to x;
        "2 l r": print a_l + a_(l+1) + ... + a_r.

        Input
        The first line contains n and q (1 <= n, q <= 2 * 10^5). The second line contains the initial
        array. Each of the next q lines contains one operation (1 <= i <= n, 1 <= l <= r <= n). All
        values have absolute value at most 10^9.

        Output
        For every operation of the second kind print the sum on its own line.

        Example
        Input:
        5 4
        1 2 3 4 5
        2 1 3
        1 2 10
        2 1 3
        2 5 5
        Output:
        6
        14
        5
        """,
        """
        import sys
        data = list(map(int, sys.stdin.read().split()))
        n, q = data[0], data[1]
        a = [0] + data[2:2 + n]
        tree = [0] * (n + 1)
        for i in range(1, n + 1):
            tree[i] += a[i]
            j = i + (i & -i)
            if j <= n:
                tree[j] += tree[i]
        def prefix(i):
            s = 0
            while i > 0:
                s += tree[i]
                i -= i & -i
            return s
        out = []
        pos = 2 + n
        for _ in range(q):
            kind, x, y = data[pos:pos + 3]
            pos += 3
            if kind == 1:
                delta = y - a[x]
                a[x] = y
                while x <= n:
                    tree[x] += delta
                    x += x & -x
            else:
                out.append(prefix(y) - prefix(x - 1))
        print("\\n".join(map(str, out)))
        """,
        [
            "5 4\n1 2 3 4 5\n2 1 3\n1 2 10\n2 1 3\n2 5 5\n",
            "1 2\n-5\n2 1 1\n1 1 7\n",
            "1 3\n0\n1 1 -1000000000\n2 1 1\n2 1 1\n",
            "3 3\n1 1 1\n2 1 3\n1 3 0\n2 2 3\n",
            "4 1\n1000000000 1000000000 1000000000 1000000000\n2 1 4\n",
            "1000 3000\n"
            + " ".join(str(_r.randint(-(10**9), 10**9)) for _ in range(1000))
            + "\n"
            + "".join(
                f"1 {_r.randint(1, 1000)} {_r.randint(-(10**9), 10**9)}\n"
                if _r.random() < 0.5
                else "2 {} {}\n".format(*sorted((_r.randint(1, 1000), _r.randint(1, 1000))))
                for _ in range(3000)
            ),
        ],
    ),
    spec(
        "subarray-one-deletion",
        "Best Block With One Removal",
        "hard",
        """
        Choose a non-empty block of consecutive array elements, then optionally remove one element of
        the block, as long as at least one element remains. Maximize the sum of the remaining elements.

        Input
        The first line contains n (1 <= n <= 2 * 10^5). The second line contains n integers
        (-10^9 <= a_i <= 10^9).

        Output
        Print the largest possible sum.

        Example
        Input:
        5
        1 -2 0 3 -1
        Output:
        4
        """,
        """
        import sys
        data = list(map(int, sys.stdin.read().split()))
        a = data[1:1 + data[0]]
        keep = a[0]
        dropped = float("-inf")
        best = a[0]
        for x in a[1:]:
            dropped = max(dropped + x, keep)
            keep = max(keep + x, x)
            best = max(best, keep, dropped)
        print(best)
        """,
        [
            "5\n1 -2 0 3 -1\n",
            "1\n-5\n",
            "2\n-3 -1\n",
            "4\n-1 -1 -1 -1\n",
            "6\n2 -10 3 -1 4 -20\n",
            "3\n1000000000 -1000000000 1000000000\n",
            array_input(_r.randint(-100, 90) for _ in range(10000)),
        ],
    ),
    spec(
        "dag-paths",
        "Counting Routes Downhill",
        "hard",
        """
        A ski resort has n stations and m one-way slopes; every slope goes from a station to a station
        with a larger number. Count the different routes (sequences of slopes) from station 1 to
        station n, modulo 1000000007. Parallel slopes between the same stations are different routes.

        Input
        The first line contains n and m (2 <= n <= 10^5, 0 <= m <= 2 * 10^5). Each of the next m lines
        contains a and b (1 <= a < b <= n): a slope from a to b.

        Output
        Print the number of routes from 1 to n modulo 1000000007.

        Example
        Input:
        4 5
        1 2
        1 3
        2 4
        3 4
        2 3
        Output:
        3
        """,
        """
        import sys
        data = list(map(int, sys.stdin.read().split()))
        n, m = data[0], data[1]
        MOD = 10**9 + 7
        into = [[] for _ in range(n + 1)]
        for i in range(m):
            into[data[3 + 2 * i]].append(data[2 + 2 * i])
        ways = [0] * (n + 1)
        ways[1] = 1
        for v in range(2, n + 1):
            ways[v] = sum(ways[u] for u in into[v]) % MOD
        print(ways[n])
        """,
        [
            "4 5\n1 2\n1 3\n2 4\n3 4\n2 3\n",
            "2 0\n",
            "2 3\n1 2\n1 2\n1 2\n",
            "3 1\n2 3\n",
            "60 " + str(59 * 2) + "\n" + "".join(f"{v} {v + 1}\n{v} {v + 1}\n" for v in range(1, 60)),
            "500 3000\n"
            + "".join(
                f"{a} {_r.randint(a + 1, min(500, a + 10))}\n"
                for a in (_r.randint(1, 499) for _ in range(3000))
            ),
        ],
    ),
    spec(
        "huge-fibonacci",
        "Huge Fibonacci",
        "hard",
        """
        The Fibonacci numbers are F(0) = 0, F(1) = 1, F(k) = F(k-1) + F(k-2). Print F(n) modulo 1000000007.

        Input
        One line with an integer n (0 <= n <= 10^18).

        Output
        Print F(n) mod 1000000007.

        Example
        Input:
        10
        Output:
        55
        """,
        """
        MOD = 10**9 + 7
        def fib(n):
            if n == 0:
                return (0, 1)
            a, b = fib(n >> 1)
            c = a * ((2 * b - a) % MOD) % MOD
            d = (a * a + b * b) % MOD
            return (d, (c + d) % MOD) if n & 1 else (c, d)
        print(fib(int(input()))[0])
        """,
        ["10\n", "0\n", "1\n", "2\n", "90\n", "1000000000000000000\n", "123456789012345\n"],
    ),
    spec(
        "two-teams",
        "Two Teams",
        "hard",
        """
        n players must be split into two teams. m pairs of players are rivals, and rivals must be on
        different teams. Decide whether such a split exists.

        Input
        The first line contains n and m (1 <= n <= 10^5, 0 <= m <= 2 * 10^5). Each of the next m lines
        contains two different players u and v (1 <= u, v <= n) who are rivals.

        Output
        Print YES if the players can be split, otherwise NO.

        Example
        Input:
        4 4
        1 2
        2 3
        3 4
        4 1
        Output:
        YES
        """,
        """
        import sys
        data = list(map(int, sys.stdin.read().split()))
        n, m = data[0], data[1]
        adj = [[] for _ in range(n + 1)]
        for i in range(m):
            u, v = data[2 + 2 * i], data[3 + 2 * i]
            adj[u].append(v)
            adj[v].append(u)
        color = [-1] * (n + 1)
        ok = True
        for s in range(1, n + 1):
            if color[s] >= 0 or not ok:
                continue
            color[s] = 0
            stack = [s]
            while stack and ok:
                u = stack.pop()
                for v in adj[u]:
                    if color[v] < 0:
                        color[v] = 1 - color[u]
                        stack.append(v)
                    elif color[v] == color[u]:
                        ok = False
                        break
        print("YES" if ok else "NO")
        """,
        [
            "4 4\n1 2\n2 3\n3 4\n4 1\n",
            "3 3\n1 2\n2 3\n3 1\n",
            "1 0\n",
            "5 2\n1 2\n4 5\n",
            "6 5\n1 2\n3 4\n5 6\n2 3\n6 1\n",
            "2000 1999\n" + "".join(f"{v} {v + 1}\n" for v in range(1, 2000)),
            "2001 2001\n" + "".join(f"{v} {v + 1}\n" for v in range(1, 2001)) + "2001 1\n",
        ],
    ),
    spec(
        "mutual-reach",
        "Mutually Reachable Groups",
        "hard",
        """
        A directed graph has n vertices and m edges. Two vertices are in the same group if each can
        reach the other along edges (every vertex can reach itself). Count the groups.

        Input
        The first line contains n and m (1 <= n <= 10^5, 0 <= m <= 2 * 10^5). Each of the next m lines
        contains u and v (1 <= u, v <= n): an edge from u to v.

        Output
        Print the number of groups (strongly connected components).

        Example
        Input:
        5 5
        1 2
        2 3
        3 1
        3 4
        5 4
        Output:
        3
        """,
        """
        import sys
        data = list(map(int, sys.stdin.read().split()))
        n, m = data[0], data[1]
        adj = [[] for _ in range(n + 1)]
        radj = [[] for _ in range(n + 1)]
        for i in range(m):
            u, v = data[2 + 2 * i], data[3 + 2 * i]
            adj[u].append(v)
            radj[v].append(u)
        order = []
        seen = [False] * (n + 1)
        for s in range(1, n + 1):
            if seen[s]:
                continue
            seen[s] = True
            stack = [(s, 0)]
            while stack:
                u, i = stack[-1]
                if i < len(adj[u]):
                    stack[-1] = (u, i + 1)
                    v = adj[u][i]
                    if not seen[v]:
                        seen[v] = True
                        stack.append((v, 0))
                else:
                    stack.pop()
                    order.append(u)
        group = [0] * (n + 1)
        groups = 0
        for s in reversed(order):
            if group[s]:
                continue
            groups += 1
            group[s] = groups
            stack = [s]
            while stack:
                u = stack.pop()
                for v in radj[u]:
                    if not group[v]:
                        group[v] = groups
                        stack.append(v)
        print(groups)
        """,
        [
            "5 5\n1 2\n2 3\n3 1\n3 4\n5 4\n",
            "1 0\n",
            "3 0\n",
            "2 2\n1 2\n2 1\n",
            "4 4\n1 1\n1 2\n2 3\n3 4\n",
            "3000 2999\n" + "".join(f"{v} {v + 1}\n" for v in range(1, 3000)),
            "1000 1500\n" + "".join(f"{_r.randint(1, 1000)} {_r.randint(1, 1000)}\n" for _ in range(1500)),
        ],
    ),
    spec(
        "tree-diameter",
        "Longest Trail",
        "hard",
        """
        A park has n clearings joined by n - 1 trails so that every clearing can be reached from every
        other one; trail i joins u_i and v_i and has length w_i. Find the largest distance between two
        clearings (the length of the longest simple path).

        Input
        The first line contains n (1 <= n <= 10^5). Each of the next n - 1 lines contains u, v, w
        (1 <= u, v <= n, 1 <= w <= 10^4).

        Output
        Print the largest distance.

        Example
        Input:
        5
        1 2 3
        2 3 4
        2 4 2
        4 5 6
        Output:
        12
        """,
        """
        import sys
        data = list(map(int, sys.stdin.read().split()))
        n = data[0]
        adj = [[] for _ in range(n + 1)]
        for i in range(n - 1):
            u, v, w = data[1 + 3 * i: 4 + 3 * i]
            adj[u].append((v, w))
            adj[v].append((u, w))
        def farthest(src):
            dist = [-1] * (n + 1)
            dist[src] = 0
            stack = [src]
            while stack:
                u = stack.pop()
                for v, w in adj[u]:
                    if dist[v] < 0:
                        dist[v] = dist[u] + w
                        stack.append(v)
            best = max(range(1, n + 1), key=lambda v: dist[v])
            return best, dist[best]
        a, _ = farthest(1)
        print(farthest(a)[1])
        """,
        [
            "5\n1 2 3\n2 3 4\n2 4 2\n4 5 6\n",
            "1\n",
            "2\n2 1 7\n",
            "4\n1 2 1\n1 3 1\n1 4 1\n",
            "4\n1 2 10000\n2 3 10000\n3 4 10000\n",
            "3000\n" + "".join(_tree(3000, True)),
        ],
    ),
    spec(
        "job-scheduling",
        "Best Set of Gigs",
        "hard",
        """
        A band is offered n gigs; gig i runs from time s_i to time e_i and pays p_i. The band can play
        only one gig at a time, but a gig may start exactly when the previous one ends. Choose gigs to
        maximize the total pay.

        Input
        The first line contains n (1 <= n <= 10^5). Each of the next n lines contains s_i, e_i, p_i
        (0 <= s_i < e_i <= 10^9, 1 <= p_i <= 10^9).

        Output
        Print the largest total pay.

        Example
        Input:
        4
        1 3 50
        3 5 20
        2 100 200
        6 19 70
        Output:
        200
        """,
        """
        import sys
        from bisect import bisect_right
        data = list(map(int, sys.stdin.read().split()))
        n = data[0]
        gigs = sorted((data[2 + 3 * i], data[1 + 3 * i], data[3 + 3 * i]) for i in range(n))
        ends = [g[0] for g in gigs]
        best = [0] * (n + 1)
        for i, (e, s, p) in enumerate(gigs):
            j = bisect_right(ends, s, 0, i)
            best[i + 1] = max(best[i], best[j] + p)
        print(best[n])
        """,
        [
            "4\n1 3 50\n3 5 20\n2 100 200\n6 19 70\n",
            "1\n0 1 5\n",
            "3\n1 2 5\n2 3 5\n3 4 5\n",
            "3\n1 10 5\n2 3 4\n3 9 4\n",
            "2\n0 1000000000 1000000000\n0 1000000000 999999999\n",
            "2000\n"
            + "".join(
                f"{s} {s + _r.randint(1, 500)} {_r.randint(1, 10**6)}\n"
                for s in (_r.randint(0, 10**5) for _ in range(2000))
            ),
        ],
    ),
    spec(
        "subset-sum-count",
        "Exact Change Subsets",
        "hard",
        """
        Count the subsets of n given positive integers whose sum is exactly T, modulo 1000000007. Equal
        numbers at different positions are different elements; the empty subset has sum 0.

        Input
        The first line contains n and T (1 <= n <= 100, 0 <= T <= 10^4). The second line contains n
        integers (1 <= a_i <= 10^4).

        Output
        Print the number of subsets with sum T modulo 1000000007.

        Example
        Input:
        4 5
        1 2 3 2
        Output:
        3
        """,
        """
        import sys
        data = list(map(int, sys.stdin.read().split()))
        n, T = data[0], data[1]
        MOD = 10**9 + 7
        ways = [1] + [0] * T
        for x in data[2:2 + n]:
            for s in range(T, x - 1, -1):
                ways[s] = (ways[s] + ways[s - x]) % MOD
        print(ways[T])
        """,
        [
            "4 5\n1 2 3 2\n",
            "1 0\n5\n",
            "3 7\n1 2 3\n",
            "5 5\n1 1 1 1 1\n",
            "100 50\n" + " ".join(["1"] * 100) + "\n",
            "60 3000\n" + " ".join(str(_r.randint(1, 200)) for _ in range(60)) + "\n",
        ],
    ),
    spec(
        "tree-distance",
        "Distances in a Family Tree",
        "hard",
        """
        A tree has n vertices joined by n - 1 edges. Answer q questions: how many edges are on the
        path between vertices u and v?

        Input
        The first line contains n (1 <= n <= 10^5). Each of the next n - 1 lines contains an edge
        a b (1 <= a, b <= n). The next line contains q (1 <= q <= 10^5), and each of the next q
        lines contains u and v (1 <= u, v <= n).

        Output
        For each question print the distance on its own line.

        Example
        Input:
        5
        1 2
        1 3
        3 4
        3 5
        3
        2 4
        4 5
        1 1
        Output:
        3
        2
        0
        """,
        """
        import sys
        data = list(map(int, sys.stdin.read().split()))
        n = data[0]
        adj = [[] for _ in range(n + 1)]
        pos = 1
        for _ in range(n - 1):
            a, b = data[pos], data[pos + 1]
            pos += 2
            adj[a].append(b)
            adj[b].append(a)
        LOG = max(1, n.bit_length())
        up = [[0] * (n + 1) for _ in range(LOG)]
        depth = [0] * (n + 1)
        seen = [False] * (n + 1)
        seen[1] = True
        stack = [1]
        up[0][1] = 1
        while stack:
            u = stack.pop()
            for v in adj[u]:
                if not seen[v]:
                    seen[v] = True
                    depth[v] = depth[u] + 1
                    up[0][v] = u
                    stack.append(v)
        for k in range(1, LOG):
            prev, cur = up[k - 1], up[k]
            for v in range(1, n + 1):
                cur[v] = prev[prev[v]]
        def lca(u, v):
            if depth[u] < depth[v]:
                u, v = v, u
            diff = depth[u] - depth[v]
            k = 0
            while diff:
                if diff & 1:
                    u = up[k][u]
                diff >>= 1
                k += 1
            if u == v:
                return u
            for k in range(LOG - 1, -1, -1):
                if up[k][u] != up[k][v]:
                    u, v = up[k][u], up[k][v]
            return up[0][u]
        q = data[pos]
        pos += 1
        out = []
        for _ in range(q):
            u, v = data[pos], data[pos + 1]
            pos += 2
            out.append(depth[u] + depth[v] - 2 * depth[lca(u, v)])
        print("\\n".join(map(str, out)))
        """,
        [
            "5\n1 2\n1 3\n3 4\n3 5\n3\n2 4\n4 5\n1 1\n",
            "1\n1\n1 1\n",
            "2\n2 1\n2\n1 2\n2 2\n",
            "6\n1 2\n2 3\n3 4\n4 5\n5 6\n3\n1 6\n6 1\n3 4\n",
            "7\n4 1\n4 2\n4 3\n1 5\n2 6\n3 7\n3\n5 6\n7 4\n5 7\n",
            "2000\n"
            + "".join(_tree(2000, False))
            + "1000\n"
            + "".join(f"{_r.randint(1, 2000)} {_r.randint(1, 2000)}\n" for _ in range(1000)),
        ],
    ),
]
