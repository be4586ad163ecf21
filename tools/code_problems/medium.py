"""Medium built-in Code-v0 problems (written for llm-zoo)."""

from code_problems.common import array_input, line, rng, spec

_r = rng(202)


def _brackets(length: int, balanced: bool) -> str:
    pairs = {"(": ")", "[": "]", "{": "}"}
    out, stack = [], []
    while len(out) < length:
        if stack and (_r.random() < 0.5 or len(out) + len(stack) >= length):
            out.append(pairs[stack.pop()])
        else:
            opener = _r.choice("([{")
            stack.append(opener)
            out.append(opener)
    out.extend(pairs[o] for o in reversed(stack))
    if not balanced:
        i = _r.randrange(len(out))
        out[i] = _r.choice(")]}" if out[i] in "([{" else "([{")
    return "".join(out)


def _grid(rows: int, cols: int, walls: float) -> str:
    cells = [["#" if _r.random() < walls else "." for _ in range(cols)] for _ in range(rows)]
    cells[0][0], cells[rows - 1][cols - 1] = "S", "T"
    return f"{rows} {cols}\n" + "".join("".join(row) + "\n" for row in cells)


def _edges(n: int, m: int) -> str:
    edges = [(_r.randint(1, n), _r.randint(1, n)) for _ in range(m)]
    return f"{n} {m}\n" + "".join(f"{u} {v}\n" for u, v in edges)


PROBLEMS = [
    spec(
        "balanced-brackets",
        "Balanced Brackets",
        "medium",
        """
        A string of the characters ( ) [ ] { } is balanced if every opening bracket is closed by
        the matching closing bracket in the right order, e.g. "([]{})" is balanced but "([)]" is not.

        Input
        The first line contains t (1 <= t <= 100). Each of the next t lines contains a non-empty
        string of at most 10^4 bracket characters.

        Output
        For each string print YES if it is balanced, otherwise NO.

        Example
        Input:
        3
        ([]{})
        ([)]
        ((
        Output:
        YES
        NO
        NO
        """,
        """
        import sys
        lines = sys.stdin.read().split()
        pairs = {")": "(", "]": "[", "}": "{"}
        out = []
        for s in lines[1:1 + int(lines[0])]:
            stack = []
            ok = True
            for ch in s:
                if ch in "([{":
                    stack.append(ch)
                elif not stack or stack.pop() != pairs[ch]:
                    ok = False
                    break
            out.append("YES" if ok and not stack else "NO")
        print("\\n".join(out))
        """,
        [
            "3\n([]{})\n([)]\n((\n",
            "1\n)\n",
            "4\n()\n)(\n{[()()]}\n[[[]]\n",
            "2\n" + _brackets(200, True) + "\n" + _brackets(200, False) + "\n",
            "1\n" + "(" * 5000 + ")" * 5000 + "\n",
            "6\n" + "".join(_brackets(_r.randint(2, 60), _r.random() < 0.5) + "\n" for _ in range(6)),
        ],
    ),
    spec(
        "longest-increasing",
        "Longest Increasing Subsequence",
        "medium",
        """
        A subsequence keeps some elements of a sequence in their original order. Find the length of
        the longest strictly increasing subsequence.

        Input
        The first line contains n (1 <= n <= 2 * 10^5). The second line contains n integers
        (-10^9 <= a_i <= 10^9).

        Output
        Print the length of the longest strictly increasing subsequence.

        Example
        Input:
        8
        10 9 2 5 3 7 101 18
        Output:
        4
        """,
        """
        import sys
        from bisect import bisect_left
        data = list(map(int, sys.stdin.read().split()))
        tails = []
        for x in data[1:1 + data[0]]:
            i = bisect_left(tails, x)
            if i == len(tails):
                tails.append(x)
            else:
                tails[i] = x
        print(len(tails))
        """,
        [
            "8\n10 9 2 5 3 7 101 18\n",
            "1\n5\n",
            "5\n3 3 3 3 3\n",
            "6\n6 5 4 3 2 1\n",
            "7\n1 2 3 4 5 6 7\n",
            array_input(_r.randint(-(10**9), 10**9) for _ in range(20000)),
        ],
    ),
    spec(
        "prime-count",
        "Counting Primes",
        "medium",
        """
        Count the prime numbers that are less than or equal to n.

        Input
        One line with an integer n (1 <= n <= 5 * 10^6).

        Output
        Print the number of primes p with p <= n.

        Example
        Input:
        10
        Output:
        4
        """,
        """
        n = int(input())
        if n < 2:
            print(0)
        else:
            sieve = bytearray([1]) * (n + 1)
            sieve[0] = sieve[1] = 0
            i = 2
            while i * i <= n:
                if sieve[i]:
                    sieve[i * i::i] = bytearray(len(range(i * i, n + 1, i)))
                i += 1
            print(sum(sieve))
        """,
        ["10\n", "1\n", "2\n", "100\n", "7919\n", "1000000\n", "5000000\n"],
    ),
    spec(
        "pair-sum-count",
        "Pairs With a Given Sum",
        "medium",
        """
        Count the pairs of positions i < j such that a_i + a_j = k.

        Input
        The first line contains n and k (1 <= n <= 2 * 10^5, -2 * 10^9 <= k <= 2 * 10^9). The
        second line contains n integers (-10^9 <= a_i <= 10^9).

        Output
        Print the number of pairs.

        Example
        Input:
        5 6
        1 5 3 3 7
        Output:
        2
        """,
        """
        import sys
        data = list(map(int, sys.stdin.read().split()))
        n, k = data[0], data[1]
        seen = {}
        pairs = 0
        for x in data[2:2 + n]:
            pairs += seen.get(k - x, 0)
            seen[x] = seen.get(x, 0) + 1
        print(pairs)
        """,
        [
            "5 6\n1 5 3 3 7\n",
            "1 2\n1\n",
            "4 4\n2 2 2 2\n",
            "3 0\n-5 5 0\n",
            "6 -2\n-1 -1 0 -2 3 -5\n",
            f"10000 10\n{line(_r.randint(0, 10) for _ in range(10000))}\n",
        ],
    ),
    spec(
        "interval-union",
        "Covered Length",
        "medium",
        """
        Some closed segments [l, r] of the number line are painted. Print the total length of the
        painted part (overlapping parts count once).

        Input
        The first line contains n (1 <= n <= 10^5). Each of the next n lines contains two integers
        l and r (-10^9 <= l <= r <= 10^9).

        Output
        Print the total painted length.

        Example
        Input:
        3
        1 4
        2 6
        8 10
        Output:
        7
        """,
        """
        import sys
        data = list(map(int, sys.stdin.read().split()))
        n = data[0]
        segs = sorted(zip(data[1:2 * n + 1:2], data[2:2 * n + 2:2]))
        total = 0
        cur_l, cur_r = segs[0]
        for l, r in segs[1:]:
            if l > cur_r:
                total += cur_r - cur_l
                cur_l, cur_r = l, r
            else:
                cur_r = max(cur_r, r)
        total += cur_r - cur_l
        print(total)
        """,
        [
            "3\n1 4\n2 6\n8 10\n",
            "1\n5 5\n",
            "2\n1 3\n3 5\n",
            "3\n0 10\n2 3\n4 5\n",
            "2\n-1000000000 1000000000\n-5 5\n",
            "500\n"
            + "".join(
                f"{a} {a + _r.randint(0, 50)}\n" for a in (_r.randint(-5000, 5000) for _ in range(500))
            ),
        ],
    ),
    spec(
        "grid-path",
        "Shortest Path in a Maze",
        "medium",
        """
        A maze is a grid of r rows and c columns. Cells are free (.), walls (#), the start S or the
        target T (S and T are free cells, each appears exactly once). In one move you go to a free
        cell that shares a side with the current one. Find the least number of moves from S to T.

        Input
        The first line contains r and c (1 <= r, c <= 500). The next r lines contain c characters each.

        Output
        Print the least number of moves, or -1 if T cannot be reached.

        Example
        Input:
        3 4
        S.#.
        .##.
        ...T
        Output:
        5
        """,
        """
        import sys
        from collections import deque
        data = sys.stdin.read().split()
        r, c = int(data[0]), int(data[1])
        grid = data[2:2 + r]
        for i in range(r):
            for j in range(c):
                if grid[i][j] == "S":
                    start = (i, j)
        dist = [[-1] * c for _ in range(r)]
        dist[start[0]][start[1]] = 0
        queue = deque([start])
        answer = -1
        while queue:
            i, j = queue.popleft()
            if grid[i][j] == "T":
                answer = dist[i][j]
                break
            for di, dj in ((1, 0), (-1, 0), (0, 1), (0, -1)):
                a, b = i + di, j + dj
                if 0 <= a < r and 0 <= b < c and grid[a][b] != "#" and dist[a][b] < 0:
                    dist[a][b] = dist[i][j] + 1
                    queue.append((a, b))
        print(answer)
        """,
        [
            "3 4\nS.#.\n.##.\n...T\n",
            "1 2\nST\n",
            "2 2\nS#\n#T\n",
            "3 3\nS..\n##.\nT..\n",
            "1 5\nT...S\n",
            _grid(60, 80, 0.25),
            _grid(100, 100, 0.1),
        ],
    ),
    spec(
        "coin-ways",
        "Ways to Pay",
        "medium",
        """
        Coins come in n denominations, with an unlimited supply of each. In how many ways can you pay
        exactly the amount m? Two ways differ if some denomination is used a different number of
        times (order does not matter). Print the count modulo 1000000007.

        Input
        The first line contains n and m (1 <= n <= 100, 0 <= m <= 10^5). The second line contains n
        distinct denominations (1 <= d_i <= 10^5).

        Output
        Print the number of ways modulo 1000000007.

        Example
        Input:
        3 5
        1 2 5
        Output:
        4
        """,
        """
        import sys
        data = list(map(int, sys.stdin.read().split()))
        n, m = data[0], data[1]
        MOD = 10**9 + 7
        ways = [0] * (m + 1)
        ways[0] = 1
        for d in data[2:2 + n]:
            for s in range(d, m + 1):
                ways[s] = (ways[s] + ways[s - d]) % MOD
        print(ways[m])
        """,
        [
            "3 5\n1 2 5\n",
            "1 0\n7\n",
            "1 3\n2\n",
            "2 10\n3 7\n",
            "4 1000\n1 5 10 25\n",
            "5 20000\n1 2 3 5 8\n",
        ],
    ),
    spec(
        "fewest-coins",
        "Fewest Coins",
        "medium",
        """
        Coins come in n denominations, with an unlimited supply of each. Pay exactly the amount m with
        as few coins as possible.

        Input
        The first line contains n and m (1 <= n <= 100, 0 <= m <= 10^5). The second line contains n
        denominations (1 <= d_i <= 10^5).

        Output
        Print the least number of coins, or -1 if m cannot be paid exactly.

        Example
        Input:
        3 11
        1 5 6
        Output:
        2
        """,
        """
        import sys
        data = list(map(int, sys.stdin.read().split()))
        n, m = data[0], data[1]
        coins = sorted(set(data[2:2 + n]))
        INF = float("inf")
        best = [0] + [INF] * m
        for s in range(1, m + 1):
            b = INF
            for d in coins:
                if d > s:
                    break
                if best[s - d] + 1 < b:
                    b = best[s - d] + 1
            best[s] = b
        print(best[m] if best[m] != INF else -1)
        """,
        [
            "3 11\n1 5 6\n",
            "1 0\n3\n",
            "2 7\n2 4\n",
            "3 30\n1 10 25\n",
            "2 99999\n2 5\n",
            "4 12345\n7 13 29 101\n",
        ],
    ),
    spec(
        "knapsack",
        "Backpack",
        "medium",
        """
        There are n items; item i has weight w_i and value v_i. Choose items (each at most once) of
        total weight at most W with the largest total value.

        Input
        The first line contains n and W (1 <= n <= 100, 0 <= W <= 10^4). Each of the next n lines
        contains w_i and v_i (1 <= w_i <= 10^4, 0 <= v_i <= 10^9).

        Output
        Print the largest total value.

        Example
        Input:
        3 5
        2 3
        3 4
        4 5
        Output:
        7
        """,
        """
        import sys
        data = list(map(int, sys.stdin.read().split()))
        n, W = data[0], data[1]
        best = [0] * (W + 1)
        for i in range(n):
            w, v = data[2 + 2 * i], data[3 + 2 * i]
            for cap in range(W, w - 1, -1):
                if best[cap - w] + v > best[cap]:
                    best[cap] = best[cap - w] + v
        print(best[W])
        """,
        [
            "3 5\n2 3\n3 4\n4 5\n",
            "1 0\n1 100\n",
            "2 10\n11 5\n10 4\n",
            "4 7\n1 1\n3 4\n4 5\n5 7\n",
            "3 100\n50 1000000000\n50 1000000000\n1 1\n",
            "40 2000\n" + "".join(f"{_r.randint(1, 300)} {_r.randint(0, 10**6)}\n" for _ in range(40)),
        ],
    ),
    spec(
        "common-subsequence",
        "Longest Common Subsequence",
        "medium",
        """
        Find the length of the longest string that is a subsequence of both given strings (a
        subsequence keeps some characters in their original order).

        Input
        Two lines, each with a non-empty string of at most 1000 lowercase letters.

        Output
        Print the length of their longest common subsequence.

        Example
        Input:
        abcde
        ace
        Output:
        3
        """,
        """
        a = input().strip()
        b = input().strip()
        prev = [0] * (len(b) + 1)
        for ch in a:
            cur = [0]
            for j, other in enumerate(b):
                cur.append(prev[j] + 1 if ch == other else max(prev[j + 1], cur[j]))
            prev = cur
        print(prev[-1])
        """,
        [
            "abcde\nace\n",
            "abc\ndef\n",
            "a\na\n",
            "aaaa\naa\n",
            "abcbdab\nbdcaba\n",
            "".join(_r.choice("abc") for _ in range(400))
            + "\n"
            + "".join(_r.choice("abc") for _ in range(300))
            + "\n",
        ],
    ),
    spec(
        "components",
        "Islands of Friends",
        "medium",
        """
        A network has n computers numbered 1 to n and m cables; a cable joins two computers (possibly
        a computer to itself). Two computers are in the same group if they are joined by a chain of
        cables. Count the groups.

        Input
        The first line contains n and m (1 <= n <= 10^5, 0 <= m <= 2 * 10^5). Each of the next m lines
        contains two integers u and v (1 <= u, v <= n).

        Output
        Print the number of groups.

        Example
        Input:
        5 3
        1 2
        2 3
        4 4
        Output:
        3
        """,
        """
        import sys
        data = list(map(int, sys.stdin.read().split()))
        n, m = data[0], data[1]
        parent = list(range(n + 1))
        def find(x):
            while parent[x] != x:
                parent[x] = parent[parent[x]]
                x = parent[x]
            return x
        groups = n
        for i in range(m):
            a, b = find(data[2 + 2 * i]), find(data[3 + 2 * i])
            if a != b:
                parent[a] = b
                groups -= 1
        print(groups)
        """,
        [
            "5 3\n1 2\n2 3\n4 4\n",
            "1 0\n",
            "3 3\n1 2\n2 3\n3 1\n",
            "4 2\n1 2\n3 4\n",
            _edges(1000, 700),
            _edges(5000, 6000),
        ],
    ),
    spec(
        "window-sum",
        "Best Window",
        "medium",
        """
        Find the largest sum of k consecutive elements of an array.

        Input
        The first line contains n and k (1 <= k <= n <= 2 * 10^5). The second line contains n
        integers (-10^9 <= a_i <= 10^9).

        Output
        Print the largest sum of a block of exactly k consecutive elements.

        Example
        Input:
        6 2
        1 -2 3 4 -1 5
        Output:
        7
        """,
        """
        import sys
        data = list(map(int, sys.stdin.read().split()))
        n, k = data[0], data[1]
        a = data[2:2 + n]
        cur = sum(a[:k])
        best = cur
        for i in range(k, n):
            cur += a[i] - a[i - k]
            if cur > best:
                best = cur
        print(best)
        """,
        [
            "6 2\n1 -2 3 4 -1 5\n",
            "1 1\n-7\n",
            "3 3\n1 2 3\n",
            "5 2\n-5 -1 -3 -1 -5\n",
            "4 1\n1000000000 -1 1000000000 5\n",
            f"20000 300\n{line(_r.randint(-(10**9), 10**9) for _ in range(20000))}\n",
        ],
    ),
    spec(
        "anagram-groups",
        "Anagram Families",
        "medium",
        """
        Two words are anagrams if one is a rearrangement of the letters of the other. Words that are
        anagrams of each other form a family. Given n words, print the number of families and the size
        of the largest family.

        Input
        The first line contains n (1 <= n <= 10^5). Each of the next n lines contains a word of 1 to 20
        lowercase letters. Words may repeat; each occurrence counts.

        Output
        Print two integers: the number of families and the size of the largest family.

        Example
        Input:
        6
        listen
        silent
        enlist
        google
        gogole
        cat
        Output:
        3 3
        """,
        """
        import sys
        from collections import Counter
        words = sys.stdin.read().split()
        families = Counter("".join(sorted(w)) for w in words[1:1 + int(words[0])])
        print(len(families), max(families.values()))
        """,
        [
            "6\nlisten\nsilent\nenlist\ngoogle\ngogole\ncat\n",
            "1\na\n",
            "3\nab\nab\nba\n",
            "4\nabc\nabd\nabe\nabf\n",
            "5\naab\naba\nbaa\nabb\nbab\n",
            "3000\n" + "".join("".join(_r.choice("abc") for _ in range(4)) + "\n" for _ in range(3000)),
        ],
    ),
    spec(
        "count-at-most",
        "How Many Are Small Enough",
        "medium",
        """
        Given an array of n integers, answer q questions: how many elements are less than or equal to x?

        Input
        The first line contains n and q (1 <= n, q <= 2 * 10^5). The second line contains the n
        array elements. Each of the next q lines contains one query x. All numbers have absolute value
        at most 10^9.

        Output
        For each query print the answer on its own line.

        Example
        Input:
        5 3
        4 1 4 9 2
        4
        0
        10
        Output:
        4
        0
        5
        """,
        """
        import sys
        from bisect import bisect_right
        data = list(map(int, sys.stdin.read().split()))
        n, q = data[0], data[1]
        a = sorted(data[2:2 + n])
        print("\\n".join(str(bisect_right(a, x)) for x in data[2 + n:2 + n + q]))
        """,
        [
            "5 3\n4 1 4 9 2\n4\n0\n10\n",
            "1 1\n5\n5\n",
            "3 2\n-1 -1 -1\n-2\n-1\n",
            "4 4\n10 20 30 40\n9\n10\n35\n1000000000\n",
            "2 1\n-1000000000 1000000000\n0\n",
            "3000 2000\n"
            + line(_r.randint(-1000, 1000) for _ in range(3000))
            + "\n"
            + "".join(f"{_r.randint(-1100, 1100)}\n" for _ in range(2000)),
        ],
    ),
    spec(
        "spiral-order",
        "Spiral Walk",
        "medium",
        """
        Walk through an r x c matrix in spiral order: along the top row from left to right, down the
        right column, along the bottom row from right to left, up the left column, then continue
        inward the same way until every cell has been visited. Print the values in visiting order.

        Input
        The first line contains r and c (1 <= r, c <= 300). The next r lines contain c integers each.

        Output
        Print all r * c values on one line, separated by spaces, in spiral order.

        Example
        Input:
        3 3
        1 2 3
        4 5 6
        7 8 9
        Output:
        1 2 3 6 9 8 7 4 5
        """,
        """
        import sys
        data = sys.stdin.read().split()
        r, c = int(data[0]), int(data[1])
        m = [data[2 + i * c: 2 + (i + 1) * c] for i in range(r)]
        top, bottom, left, right = 0, r - 1, 0, c - 1
        out = []
        while top <= bottom and left <= right:
            out.extend(m[top][j] for j in range(left, right + 1))
            out.extend(m[i][right] for i in range(top + 1, bottom + 1))
            if top < bottom:
                out.extend(m[bottom][j] for j in range(right - 1, left - 1, -1))
            if left < right:
                out.extend(m[i][left] for i in range(bottom - 1, top, -1))
            top, bottom, left, right = top + 1, bottom - 1, left + 1, right - 1
        print(" ".join(out))
        """,
        [
            "3 3\n1 2 3\n4 5 6\n7 8 9\n",
            "1 1\n5\n",
            "1 4\n1 2 3 4\n",
            "4 1\n1\n2\n3\n4\n",
            "3 4\n1 2 3 4\n5 6 7 8\n9 10 11 12\n",
            "4 2\n1 2\n3 4\n5 6\n7 8\n",
            "20 17\n" + "".join(line(_r.randint(0, 99) for _ in range(17)) + "\n" for _ in range(20)),
        ],
    ),
    spec(
        "edit-distance",
        "Typo Distance",
        "medium",
        """
        The edit distance of two strings is the least number of single-character insertions,
        deletions and substitutions that turn the first into the second. Compute it.

        Input
        Two lines, each with a string of 1 to 500 lowercase letters.

        Output
        Print the edit distance.

        Example
        Input:
        kitten
        sitting
        Output:
        3
        """,
        """
        a = input().strip()
        b = input().strip()
        prev = list(range(len(b) + 1))
        for i, ch in enumerate(a, 1):
            cur = [i]
            for j, other in enumerate(b, 1):
                cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (ch != other)))
            prev = cur
        print(prev[-1])
        """,
        [
            "kitten\nsitting\n",
            "a\na\n",
            "abc\nxyz\n",
            "a\nzzzz\n",
            "intention\nexecution\n",
            "".join(_r.choice("ab") for _ in range(300))
            + "\n"
            + "".join(_r.choice("ab") for _ in range(250))
            + "\n",
        ],
    ),
    spec(
        "next-greater",
        "Next Taller Building",
        "medium",
        """
        Buildings stand in a row. For every building, find the height of the first building to its
        right that is strictly taller, or -1 if there is none.

        Input
        The first line contains n (1 <= n <= 2 * 10^5). The second line contains n heights
        (1 <= h_i <= 10^9).

        Output
        Print n integers on one line, separated by spaces.

        Example
        Input:
        5
        2 7 3 5 4
        Output:
        7 -1 5 -1 -1
        """,
        """
        import sys
        data = list(map(int, sys.stdin.read().split()))
        n = data[0]
        h = data[1:1 + n]
        answer = [-1] * n
        stack = []
        for i, x in enumerate(h):
            while stack and h[stack[-1]] < x:
                answer[stack.pop()] = x
            stack.append(i)
        print(" ".join(map(str, answer)))
        """,
        [
            "5\n2 7 3 5 4\n",
            "1\n10\n",
            "4\n5 5 5 5\n",
            "5\n1 2 3 4 5\n",
            "6\n6 1 5 2 4 3\n",
            array_input(_r.randint(1, 1000) for _ in range(5000)),
        ],
    ),
    spec(
        "task-order",
        "Task Order",
        "medium",
        """
        There are n tasks numbered 1 to n and m rules "task a must be done before task b". Print an
        order that does all tasks and obeys every rule; if several orders work, print the one that is
        smallest in lexicographic order (at each step do the smallest-numbered task that is allowed).

        Input
        The first line contains n and m (1 <= n <= 10^5, 0 <= m <= 2 * 10^5). Each of the next m lines
        contains a and b (1 <= a, b <= n).

        Output
        Print the n task numbers in order, separated by spaces, or IMPOSSIBLE if no order obeys all rules.

        Example
        Input:
        4 3
        2 1
        4 3
        2 3
        Output:
        2 1 4 3
        """,
        """
        import sys
        import heapq
        data = list(map(int, sys.stdin.read().split()))
        n, m = data[0], data[1]
        after = [[] for _ in range(n + 1)]
        indeg = [0] * (n + 1)
        for i in range(m):
            a, b = data[2 + 2 * i], data[3 + 2 * i]
            after[a].append(b)
            indeg[b] += 1
        heap = [v for v in range(1, n + 1) if indeg[v] == 0]
        heapq.heapify(heap)
        order = []
        while heap:
            v = heapq.heappop(heap)
            order.append(v)
            for w in after[v]:
                indeg[w] -= 1
                if indeg[w] == 0:
                    heapq.heappush(heap, w)
        print(" ".join(map(str, order)) if len(order) == n else "IMPOSSIBLE")
        """,
        [
            "4 3\n2 1\n4 3\n2 3\n",
            "1 0\n",
            "2 2\n1 2\n2 1\n",
            "3 1\n1 1\n",
            "5 0\n",
            "6 5\n6 5\n5 4\n4 3\n3 2\n2 1\n",
            "300 400\n"
            + "".join(f"{a} {_r.randint(a + 1, 300)}\n" for a in (_r.randint(1, 299) for _ in range(400))),
        ],
    ),
]
